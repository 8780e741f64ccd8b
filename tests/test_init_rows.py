"""``RowInitializer`` / ``init_rows`` against a plain NumPy reference of the draw: the values of a row
depend on (key, seed, column) only, wherever and in whatever order the rows are written (the kernel
prefetches the rows ahead for writing; that must change no bit)."""

import numpy as np
import pytest

from hps.mem import RowInitializer

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix64(x):
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def _reference(keys, seed, emb_dim, width, scale, state):
    """The initial rows (n, width) float32 in NumPy: column j < emb_dim of key k is
    mix64(mix64(k ^ base) + (j + 1) * golden) mapped to [-scale, scale); the rest ``state``."""
    with np.errstate(over="ignore"):
        base = _mix64(np.uint64(seed) ^ np.uint64(0xD1B54A32D192ED03))
        h = _mix64(keys ^ base)[:, None]
        cols = (np.arange(1, emb_dim + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))[None, :]
        x = _mix64(h + cols)
    u = (x >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    v = ((2.0 * u - 1.0) * scale).astype(np.float32)
    v[v >= np.float32(scale)] = -np.float32(scale)
    out = np.full((keys.shape[0], width), np.float32(state), np.float32)
    out[:, :emb_dim] = v
    return out


@pytest.mark.parametrize("emb_dim, width", [(32, 64), (8, 10), (5, 5), (0, 3)])
def test_rows_equal_the_numpy_reference_at_scattered_rows(emb_dim, width):
    rng = np.random.default_rng(emb_dim)
    keys = np.concatenate([rng.integers(0, 2**64, 3000, dtype=np.uint64, endpoint=False),
                           np.array([0, 2**64 - 2], np.uint64)])
    init = RowInitializer(emb_dim, width, seed=11, scale=0.03, state_value=0.25)
    expect = _reference(keys, 11, emb_dim, width, 0.03, 0.25)
    np.testing.assert_array_equal(init(keys), expect)                       # in order
    out = np.full((20000, width), -7.0, np.float32)
    at = rng.permutation(out.shape[0])[:keys.shape[0]]                      # scattered, as the twin's slots
    init.fill(keys, out, at)
    np.testing.assert_array_equal(out[at], expect)
    rest = np.ones(out.shape[0], bool)
    rest[at] = False
    assert (out[rest] == -7.0).all()                                         # no other row written
