"""Kernels of OP+OSRP hashing (``hps.data._oposrp``): arithmetic modulo the Mersenne prime 2^61 - 1
and the batched per-example hash. Kernels only; every value they need is an argument."""

from __future__ import annotations

import numpy as np

from .._jit import njit


@njit(nogil=True, cache=True, inline="always")
def mulmod61(a, b):
    """(a * b) mod (2^61 - 1) for a, b in [0, 2^61 - 1), exact in 64-bit halves."""
    M = np.uint64(0x1FFFFFFFFFFFFFFF)
    lo32 = np.uint64(0xFFFFFFFF)
    a_hi, a_lo = a >> np.uint64(32), a & lo32
    b_hi, b_lo = b >> np.uint64(32), b & lo32
    lo = a_lo * b_lo                                   # < 2^64
    mid = a_hi * b_lo + a_lo * b_hi                    # < 2^62
    hi = a_hi * b_hi                                   # < 2^58
    # a b = hi 2^64 + mid 2^32 + lo, with 2^61 = 1 and 2^64 = 8 (mod M)
    r = ((hi << np.uint64(3)) + (mid >> np.uint64(29)) + ((mid & np.uint64(0x1FFFFFFF)) << np.uint64(32))
         + (lo >> np.uint64(61)) + (lo & M))
    r = (r & M) + (r >> np.uint64(61))
    if r >= M:
        r -= M
    return r


@njit(nogil=True, cache=True, inline="always")
def addmod61(a, b):
    M = np.uint64(0x1FFFFFFFFFFFFFFF)
    r = a + b
    if r >= M:
        r -= M
    return r


@njit(nogil=True, cache=True)
def op_osrp_kernel(keys, weights, offsets, bins, perm, sign, out, out_offsets, scratch_bin, scratch_z):
    """OP+OSRP of every example (Zhao et al. 2020, §2), one pass over the nonzeros.

    keys (nnz,) uint64, weights (nnz,) float32 (the feature values x_i; 1 for binary data), offsets
    (n + 1,) int64 (example i = keys[offsets[i]:offsets[i + 1]]); bins: k; perm (2,) uint64 (a, b)
    of the 2U permutation pos = (a x + b) mod M; sign (4,) uint64 (c0..c3) of the 4U hash whose
    lowest bit gives r = +1 (odd) or -1 (even); x = key mod M. Bin of a feature: pos // ceil(M / k).
    Fills out (nnz,) int64 with the active hashed features of each example in ascending bin order:
    2 b + 1 when z_b > 0 ([0 1]), 2 b when z_b < 0 ([1 0]), nothing for z_b = 0 or an empty bin
    ([0 0]); out_offsets (n + 1,) int64 like offsets. scratch_bin (w,) int64, scratch_z (w,) float64
    with w >= the most nonzeros of one example. Returns the number of features written."""
    M = np.uint64(0x1FFFFFFFFFFFFFFF)
    width = (M + np.uint64(bins) - np.uint64(1)) // np.uint64(bins)
    m = 0
    out_offsets[0] = 0
    for i in range(offsets.shape[0] - 1):
        cnt = 0
        for j in range(offsets[i], offsets[i + 1]):
            x = keys[j] % M
            b = np.int64(addmod61(mulmod61(perm[0], x), perm[1]) // width)
            h = sign[3]
            for t in range(2, -1, -1):                 # Horner: ((c3 x + c2) x + c1) x + c0
                h = addmod61(mulmod61(h, x), sign[t])
            v = np.float64(weights[j]) if h & np.uint64(1) else -np.float64(weights[j])
            # insert (b, v) into the example's bins, kept sorted (examples have few nonzeros)
            p = cnt
            while p > 0 and scratch_bin[p - 1] > b:
                p -= 1
            if p > 0 and scratch_bin[p - 1] == b:
                scratch_z[p - 1] += v
                continue
            for q in range(cnt, p, -1):
                scratch_bin[q] = scratch_bin[q - 1]
                scratch_z[q] = scratch_z[q - 1]
            scratch_bin[p] = b
            scratch_z[p] = v
            cnt += 1
        for q in range(cnt):
            if scratch_z[q] > 0:
                out[m] = 2 * scratch_bin[q] + 1
                m += 1
            elif scratch_z[q] < 0:
                out[m] = 2 * scratch_bin[q]
                m += 1
        out_offsets[i + 1] = m
    return m
