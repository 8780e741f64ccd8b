"""The ``prefetch`` intrinsic compiles for the arrays the kernels pass it and changes no result."""

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from hps._prefetch import prefetch


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
