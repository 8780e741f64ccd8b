"""--compress codecs (hps.comm._compress): bfloat16 rounding to nearest even checked against a
reference that picks the nearer of the two neighbouring bfloat16 values in float64, int8 rows
within half a quantisation step rounded to bfloat16 (tiny rows as zeros, NaN/inf rows as all NaN),
and the channel exchanges of a one-process job left alone."""

import numpy as np
import pytest

from hps.comm import COMPRESS_MODES, CommStats, Compression
from hps.comm._compress import INT8_SCALE_BYTES, exchange, from_bf16, from_int8_rows, to_bf16, to_int8_rows
from hps.errors import InvalidInputError
from hps.train._collectives import Channel

#: Documented int8 row bound, in steps of max|row| / 127: half a step, the step rounded to bfloat16.
INT8_BOUND = (1 + 2.0 ** -8) / 2
#: Rows with max|row| below this (a zero or subnormal bfloat16 scale) are sent as zeros.
INT8_FLUSH = 127 * 2.0 ** -126


def reference_bf16(x: np.ndarray) -> np.ndarray:
    """Nearest bfloat16 of each finite float32 (ties to the even one), NaN as NaN: by distance."""
    bits = x.view(np.uint32)
    lo = (bits >> 16).astype(np.uint16)                           # truncated (towards zero)
    hi = lo + np.uint16(1)
    f = lambda h: (h.astype(np.uint32) << 16).view(np.float32).astype(np.float64)  # noqa: E731
    with np.errstate(invalid="ignore", over="ignore"):
        dlo, dhi = np.abs(x.astype(np.float64) - f(lo)), np.abs(f(hi) - x.astype(np.float64))
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (lo & 1 == 1))
    return np.where(pick_hi, hi, lo)


def test_bf16_rounds_to_nearest_even_like_the_reference():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(5000), rng.standard_normal(5000) * 1e-30,
                        rng.standard_normal(5000) * 1e30]).astype(np.float32)
    got = to_bf16(x)
    np.testing.assert_array_equal(got, reference_bf16(x))
    assert np.abs(from_bf16(got) - x).max() <= np.abs(x).max() * 2.0 ** -8


def test_bf16_ties_specials_and_exact_values():
    bits = np.array([0x3F808000,   # 1 + 2^-8: a tie between 0x3F80 (even) and 0x3F81 -> 0x3F80
                     0x3F818000,   # tie between 0x3F81 and 0x3F82 (even) -> 0x3F82
                     0x3F808001,   # just above the tie -> up
                     0x7F7FFFFF,   # largest float32 -> inf
                     0x7F800000, 0xFF800000,   # +-inf stay
                     0x7FC00001, 0xFF800001,   # NaNs stay NaN
                     0x00000001, 0x80000000], np.uint32)  # tiniest denormal -> +0, -0 stays
    got = to_bf16(bits.view(np.float32))
    assert got[:6].tolist() == [0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x7F80, 0xFF80]
    assert np.isnan(from_bf16(got[6:8])).all()
    assert got[8:].tolist() == [0x0000, 0x8000]
    exact = np.array([1.0, -2.5, 0.0, 3.0 * 2 ** -20], np.float32)   # fit in 8 bits of mantissa
    np.testing.assert_array_equal(from_bf16(to_bf16(exact)), exact)
    assert to_bf16(np.zeros((3, 4), np.float32)).shape == (3, 4)


@pytest.mark.parametrize("d", [1, 8, 16])
def test_int8_rows_are_within_half_a_step_and_take_d_plus_2_bytes(d):
    rng = np.random.default_rng(d)
    x = (rng.standard_normal((200, d)) * rng.uniform(1e-3, 10, size=(200, 1))).astype(np.float32)
    x[3] = 0.0
    packed = to_int8_rows(x)
    assert packed.dtype == np.uint8 and packed.shape == (200, d + INT8_SCALE_BYTES)
    y = from_int8_rows(packed)
    step = np.abs(x).max(axis=1, keepdims=True) / 127
    assert (np.abs(y - x) <= step * INT8_BOUND).all()     # half a step rounded up to bfloat16
    np.testing.assert_array_equal(y[3], 0.0)
    assert np.abs(y).max() <= np.abs(x).max() * (1 + 2.0 ** -8)


def test_modes_and_formats():
    assert COMPRESS_MODES == ("none", "bf16", "int8")
    c = Compression("int8")
    assert (c.rows, c.grads, c.dense) == ("int8", "bf16", "bf16")  # §4.2: gradients stay bf16
    c = Compression("bf16")
    assert (c.rows, c.grads, c.dense) == ("bf16", "bf16", "bf16")
    with pytest.raises(InvalidInputError, match="compress must be one of"):
        Compression("fp8")


def test_one_process_channel_passes_rows_through_untouched():
    ch = Channel("train", None, CommStats())
    rows = np.random.default_rng(1).standard_normal((5, 3)).astype(np.float32)
    for fmt in ("none", "bf16", "int8"):
        out = exchange(ch, rows, np.array([5]), np.array([5]), "sparse_rows", fmt)
        assert out is rows
    vec = rows.ravel().copy()
    assert Compression("bf16").allreduce_dense(ch, vec) is vec


def test_int8_rows_with_nan_or_inf_decode_as_all_nan():
    x = np.array([[np.nan, 1.0, -0.5], [np.inf, 1.0, 0.0], [0.0, -np.inf, 2.0], [1.0, -0.5, 0.25]], np.float32)
    packed = to_int8_rows(x)
    assert packed[:3, :INT8_SCALE_BYTES].copy().view(np.uint16).ravel().tolist() == [0x7FC0] * 3
    assert (packed[:3, INT8_SCALE_BYTES:] == 0).all()
    y = from_int8_rows(packed)
    assert np.isnan(y[:3]).all()
    np.testing.assert_allclose(y[3], x[3], atol=INT8_BOUND / 127)   # other rows unaffected


def test_int8_tiny_rows_flush_to_zero_and_rows_above_keep_the_bound():
    x = np.array([[1e-37, 1e-40, 0.0], [3e-38, -1e-39, 0.0], [1e-45, 0.0, -1e-45],
                  [1.4e-36, -1e-40, 5e-37]], np.float32)
    y = from_int8_rows(to_int8_rows(x))
    np.testing.assert_array_equal(y, 0.0)
    x = np.array([[1.5e-36, -1e-40, 5e-37], [1e-30, 3e-31, -1e-33]], np.float32)   # normal bfloat16 scale
    y = from_int8_rows(to_int8_rows(x))
    assert (np.abs(y - x) <= np.abs(x).max(axis=1, keepdims=True) / 127 * INT8_BOUND).all()


def test_int8_bound_on_random_rows_of_every_magnitude():
    """Half a step rounded up to bfloat16, (1 + 2^-8) / 2 * max|row| / 127 (always when max|row| >= 127 * 2^-126),
    else all zeros; the values sit at half-integer multiples of a scale that bfloat16 rounds up by ~2^-8."""
    rng = np.random.default_rng(5)
    n = 40000
    mag = 2.0 ** rng.uniform(-145, 120, n)
    x = (rng.standard_normal((n, 8)) * mag[:, None]).astype(np.float32)
    step = 2.0 ** rng.integers(-126, 110, n) * (1 + rng.integers(0, 128, n) / 128 + 2.0 ** -8 + 2.0 ** -14)
    half = (rng.integers(-126, 127, (n, 7)) + 0.5) * step[:, None] * (1 + 2.0 ** -8)
    adv = np.concatenate([(127 * step)[:, None], half], axis=1).astype(np.float32)
    for rows, tiny in ((x, 1000), (adv, 0)):
        y = from_int8_rows(to_int8_rows(rows))
        amax = np.abs(rows).max(axis=1, keepdims=True).astype(np.float64)
        err = np.abs(y.astype(np.float64) - rows)
        within = (err <= amax / 127 * INT8_BOUND).all(axis=1)
        assert within[amax[:, 0] >= INT8_FLUSH].all()
        assert (y[~within] == 0).all() and (amax[~within] < INT8_FLUSH).all() and (~within).sum() >= tiny
