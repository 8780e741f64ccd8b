"""The ``prefetch`` intrinsic compiles for the arrays the kernels pass it and changes no result."""

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from hps._prefetch import prefetch, prefetch_ahead, prefetch_row_write


@njit
def _sum_prefetched(a, idx):
    for i in range(idx.shape[0]):
        prefetch(a, idx[i])
    s = 0.0
    for i in range(idx.shape[0]):
        s += a[idx[i]].sum() if a.ndim == 2 else a[idx[i]]
    return s


@pytest.mark.parametrize("shape", [(1000,), (1000, 2)])
def test_prefetch_is_a_hint_only(shape):
    a = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    idx = np.random.default_rng(0).integers(0, shape[0], 50)
    expect = a[idx].sum()
    assert _sum_prefetched(a, idx) == expect
    assert _sum_prefetched(a[::2], idx // 2) == a[::2][idx // 2].sum()   # strided view


def test_prefetch_rejects_what_it_cannot_address():
    @njit
    def bad(a):
        prefetch(a, 0)

    with pytest.raises(TypingError):
        bad(np.zeros((2, 2, 2)))


def test_prefetch_home_compiles_for_every_table_and_changes_nothing():
    """``prefetch_home`` (the kernels' one home-cell prefetch, ``prefetch_ahead()`` keys ahead) takes
    the tables' cell dtypes and leaves them as they were."""
    from hps._prefetch import prefetch_ahead, prefetch_home

    @njit
    def touch(tab, keys):
        for i in range(keys.shape[0]):
            prefetch_home(tab, keys[i])
        return prefetch_ahead()

    keys = np.array([0, 1, 2 ** 64 - 1, 12345], dtype=np.uint64)
    for tab in (np.full(16, -1, np.int32), np.arange(64, dtype=np.uint64), np.zeros(8, np.int64)):
        before = tab.copy()
        assert touch(tab, keys) == 16
        np.testing.assert_array_equal(tab, before)


@njit
def _copy_rows_prefetched(src, out, at):
    for i in range(at.shape[0]):
        if i + prefetch_ahead() < at.shape[0]:
            prefetch_row_write(out, at[i + prefetch_ahead()])
        prefetch_row_write(out, at[i])
        for j in range(src.shape[1]):
            out[at[i], j] = src[i, j]


@pytest.mark.parametrize("width, dtype", [(64, np.float32), (3, np.float32), (17, np.float64), (0, np.float32)])
def test_prefetch_row_write_is_a_hint_only(width, dtype):
    """``prefetch_row_write`` (every line of a row, for writing) compiles for the rows the kernels
    write (widths under, over and not a multiple of a cache line, and none) and changes no value."""
    rng = np.random.default_rng(1)
    out = rng.standard_normal((500, width)).astype(dtype)
    src = rng.standard_normal((100, width)).astype(dtype)
    at = rng.permutation(500)[:100]
    expect = out.copy()
    expect[at] = src
    _copy_rows_prefetched(src, out, at)
    np.testing.assert_array_equal(out, expect)
