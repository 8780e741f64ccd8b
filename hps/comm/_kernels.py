"""Numba kernels of the communication layer: reduce-by-key on sorted key arrays, segment sums.

Kernels only: no I/O, no config, no module globals. Every array is a C-contiguous host array.
Summation order is fixed by the arguments alone (left operand first, then right; duplicates in
input order), so the same inputs give the same bits on every rank.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit


@njit(nogil=True, cache=True)
def reduce_sorted(keys, values):
    """Sum the rows of equal keys of an ascending-sorted key array.

    keys (n,) uint64 sorted ascending (duplicates adjacent); values (n, d) float32/float64.
    Returns (ukeys (m,) uint64 strictly ascending, sums (m, d) same dtype); duplicates are summed
    left to right in input order.
    """
    n = keys.shape[0]
    d = values.shape[1]
    m = 0
    for i in range(n):
        if i == 0 or keys[i] != keys[i - 1]:
            m += 1
    out_k = np.empty(m, dtype=keys.dtype)
    out_v = np.empty((m, d), dtype=values.dtype)
    j = -1
    for i in range(n):
        if i == 0 or keys[i] != keys[i - 1]:
            j += 1
            out_k[j] = keys[i]
            for c in range(d):
                out_v[j, c] = values[i, c]
        else:
            for c in range(d):
                out_v[j, c] += values[i, c]
    return out_k, out_v


@njit(nogil=True, cache=True)
def merge_sum(ka, va, kb, vb):
    """Merge two strictly ascending key arrays; rows of a key present in both are ``va + vb``.

    ka (na,) uint64, va (na, d); kb (nb,) uint64, vb (nb, d), same dtype and d.
    Returns (keys (m,) uint64 strictly ascending, values (m, d)). IEEE addition is commutative, so
    ``merge_sum(a, b)`` and ``merge_sum(b, a)`` give identical bits.
    """
    na = ka.shape[0]
    nb = kb.shape[0]
    d = va.shape[1]
    # count the union first so the output is allocated once
    i = 0
    j = 0
    m = 0
    while i < na and j < nb:
        if ka[i] < kb[j]:
            i += 1
        elif kb[j] < ka[i]:
            j += 1
        else:
            i += 1
            j += 1
        m += 1
    m += (na - i) + (nb - j)
    out_k = np.empty(m, dtype=ka.dtype)
    out_v = np.empty((m, d), dtype=va.dtype)
    i = 0
    j = 0
    o = 0
    while i < na and j < nb:
        if ka[i] < kb[j]:
            out_k[o] = ka[i]
            for c in range(d):
                out_v[o, c] = va[i, c]
            i += 1
        elif kb[j] < ka[i]:
            out_k[o] = kb[j]
            for c in range(d):
                out_v[o, c] = vb[j, c]
            j += 1
        else:
            out_k[o] = ka[i]
            for c in range(d):
                out_v[o, c] = va[i, c] + vb[j, c]
            i += 1
            j += 1
        o += 1
    while i < na:
        out_k[o] = ka[i]
        for c in range(d):
            out_v[o, c] = va[i, c]
        i += 1
        o += 1
    while j < nb:
        out_k[o] = kb[j]
        for c in range(d):
            out_v[o, c] = vb[j, c]
        j += 1
        o += 1
    return out_k, out_v


@njit(nogil=True, cache=True)
def segment_sum(values, index, n):
    """Rows of ``values`` summed by ``index``: out[index[i]] += values[i], in input order.

    values (m, d) float32/float64; index (m,) int64 in [0, n). Returns (n, d) of values' dtype
    (rows no index names are zero). The order of the additions is fixed by the arguments alone.
    """
    d = values.shape[1]
    out = np.zeros((n, d), dtype=values.dtype)
    for i in range(values.shape[0]):
        j = index[i]
        for c in range(d):
            out[j, c] += values[i, c]
    return out
