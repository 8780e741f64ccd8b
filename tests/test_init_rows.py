"""``RowInitializer`` / ``init_rows`` against a plain NumPy reference of the draw: the values of a row
depend on (key, seed, column) only, wherever and in whatever order the rows are written (the kernel
prefetches the rows ahead for writing; that must change no bit)."""

import numpy as np
import pytest

from hps.errors import InvalidInputError
from hps.mem import RowInitializer
from hps.mem._init import ORDER_BUCKET_ROWS, ORDER_MIN_ROWS
from hps.mem._init_kernels import in_row_order

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


@pytest.mark.parametrize("emb_dim, width, m", [(32, 64, 20000), (8, 10, 20000), (5, 5, 20000), (0, 3, 20000),
                                                (8, 10, ORDER_MIN_ROWS + 5)])
def test_rows_equal_the_numpy_reference_at_scattered_rows(emb_dim, width, m):
    """Into a small array and into one large enough that the rows are written in the order of their
    place (``_in_row_order``): the same values, at the same rows, no other row written."""
    rng = np.random.default_rng(emb_dim)
    keys = np.concatenate([rng.integers(0, 2**64, 3000, dtype=np.uint64, endpoint=False),
                           np.array([0, 2**64 - 2], np.uint64)])
    init = RowInitializer(emb_dim, width, seed=11, scale=0.03, state_value=0.25)
    expect = _reference(keys, 11, emb_dim, width, 0.03, 0.25)
    np.testing.assert_array_equal(init(keys), expect)                       # in order
    out = np.full((m, width), -7.0, np.float32)
    at = rng.permutation(out.shape[0])[:keys.shape[0]]                      # scattered, as the twin's slots
    init.fill(keys, out, at)
    np.testing.assert_array_equal(out[at], expect)
    rest = np.ones(out.shape[0], bool)
    rest[at] = False
    assert (out[rest] == -7.0).all()                                         # no other row written


@pytest.mark.parametrize("scale", [0.01, 1.0, 3.0, 1e-30])
def test_draws_are_bit_identical_to_the_uint64_to_float64_reference(scale):
    """The kernel converts each draw's 53 bits through two exact float64 halves (a loop AVX2
    vectorises): every bit equals ``float64(x >> 11)``'s draw, at large and tiny scales and at keys whose
    draws have high bits in either half."""
    rng = np.random.default_rng(17)
    keys = np.concatenate([rng.integers(0, 2**64, 20000, dtype=np.uint64, endpoint=False),
                           np.arange(64, dtype=np.uint64), (np.uint64(1) << np.arange(64, dtype=np.uint64))[:-1]])
    got = RowInitializer(32, 33, seed=2**63 + 9, scale=scale, state_value=-1.5)(keys)
    expect = _reference(keys, 2**63 + 9, 32, 33, scale, -1.5)
    np.testing.assert_array_equal(got.view(np.uint32), expect.view(np.uint32))


def test_in_row_order_is_a_stable_sort_by_bucket():
    """``in_row_order`` against NumPy's stable argsort by ``at >> shift``; rows already in bucket
    order are reported so and left unwritten."""
    rng = np.random.default_rng(3)
    shift = ORDER_BUCKET_ROWS.bit_length() - 1
    m = 50 * ORDER_BUCKET_ROWS
    at = rng.permutation(m)[:5000].astype(np.int64)
    at[10:20] = at[5]                                   # equal rows keep their order too
    keys = rng.integers(0, 2**64, at.shape[0], dtype=np.uint64, endpoint=False)
    skeys, sat = np.empty_like(keys), np.empty_like(at)
    assert in_row_order(keys, at, shift, np.zeros((m >> shift) + 2, np.int64), skeys, sat)
    o = np.argsort(at >> shift, kind="stable")
    np.testing.assert_array_equal(sat, at[o])
    np.testing.assert_array_equal(skeys, keys[o])
    ordered = np.sort(at >> shift) << shift
    untouched = np.full_like(at, -1)
    assert not in_row_order(keys, ordered, shift, np.zeros((m >> shift) + 2, np.int64), skeys, untouched)
    assert (untouched == -1).all()


def test_fill_refuses_rows_outside_out():
    init = RowInitializer(2, 4, seed=0)
    out = np.zeros((ORDER_MIN_ROWS, 4), np.float32)
    keys = np.array([1, 2], np.uint64)
    for bad in ([0, ORDER_MIN_ROWS], [-1, 3]):
        with pytest.raises(InvalidInputError, match="fill needs rows at in"):
            init.fill(keys, out, np.array(bad))
    assert not out.any()
