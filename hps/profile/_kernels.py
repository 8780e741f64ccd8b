"""Counting kernels of the FAE profiler and input classifier (``seeds/003`` §4.1.2, §4.2). Kernels only.

Array contracts (host NumPy, blocking, no allocation beyond the returned array):

- ``chunk_hot_counts(sampled, cutoff)``: sampled (n, m) int64 access counts of the n sampled logger
  chunks -> (n,) int64 ``C_i``, entries of chunk i with count >= ``cutoff`` (Eq. 2).
- ``examples_all_hot(hot_key, offsets)``: hot_key (nnz,) bool, offsets (n + 1,) int64 CSR bounds ->
  (n,) bool, example i is hot iff every one of its keys is hot (an input with no keys is hot).
"""

from __future__ import annotations

import numpy as np

from .._jit import njit


@njit(nogil=True, cache=True)
def chunk_hot_counts(sampled, cutoff):
    n, m = sampled.shape
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        c = 0
        for j in range(m):
            if sampled[i, j] >= cutoff:
                c += 1
        out[i] = c
    return out


@njit(nogil=True, cache=True)
def examples_all_hot(hot_key, offsets):
    n = offsets.shape[0] - 1
    out = np.ones(n, dtype=np.bool_)
    for i in range(n):
        for k in range(offsets[i], offsets[i + 1]):
            if not hot_key[k]:
                out[i] = False
                break
    return out
