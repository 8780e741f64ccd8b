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
