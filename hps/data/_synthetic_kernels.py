"""Numba kernels of the synthetic generator (kernels only: no I/O, no globals).

``synth_block`` turns a block's uniforms into their keys: the bounded-Zipf rank of each uniform (the
exact inverse CDF of the head, found through a guide table — the same rank as ``searchsorted(cdf,
u, side="right")`` — and the closed-form tail) and the key of the rank; the planted normals of the
most popular keys come from a table, the others are left to NumPy (``_synthetic.planted_normal``:
its vectorised log and cos are both faster than libm's and the very values of the table). Blocking,
single-threaded, ``nogil`` (the parallel readers generate blocks in threads).
"""

from __future__ import annotations

import math

import numpy as np

from .._hashing import mix64
from .._jit import njit
from .._prefetch import prefetch


@njit(nogil=True, cache=True)
def guide_table(cdf, size):
    """(size + 1,) int64: entry j = ``searchsorted(cdf, j / size, side="right")`` (cdf ascending; size a
    power of two, so ``j / size`` is exact)."""
    out = np.empty(size + 1, dtype=np.int64)
    k = 0
    for j in range(size + 1):
        x = j / size
        while k < cdf.shape[0] and cdf[k] <= x:
            k += 1
        out[j] = k
    return out


@njit(nogil=True, cache=True, inline="always")
def _rank(x, cdf, guide, n_vocab, p_head, total, s, a_pow):
    """The bounded-Zipf rank (int64) of the uniform x (see ``synth_block``)."""
    head = cdf.shape[0]
    g = guide.shape[0] - 1
    j = int(x * g)
    lo = guide[j]
    hi = guide[j + 1]
    while lo < hi:  # first rank whose cumulative weight exceeds x, inside the guide's bucket
        mid = (lo + hi) >> 1
        if cdf[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    k = np.int64(lo)
    if n_vocab > head and x >= p_head:  # the tail: the continuous law's inverse
        m = (x - p_head) * total
        a = head + 1.0
        y = a * np.exp(m) if abs(s - 1.0) < 1e-12 else (a_pow + (1.0 - s) * m) ** (1.0 / (1.0 - s))
        k = np.int64(math.floor(y)) - 1
    return min(k, n_vocab - 1)


@njit(nogil=True, cache=True)
def zipf_ranks(u, cdf, guide, n_vocab, p_head, total, s, out):
    """out (m,) int64: the rank of each uniform of u (m,) float64, as ``synth_block`` draws them."""
    a_pow = (cdf.shape[0] + 1.0) ** (1.0 - s)
    for i in range(u.shape[0]):
        out[i] = _rank(u[i], cdf, guide, n_vocab, p_head, total, s, a_pow)


@njit(nogil=True, cache=True)
def synth_block(u, cdf, guide, n_vocab, p_head, total, s, drift, shift, ztab, seed_mix, salt, keys, z, miss,
                u1, u2):
    """Keys of one block, and the planted normals of those in the table.

    The guide's size G is a power of two, so ``x * G`` and ``j / G`` are exact and the rank lies in
    ``[guide[j], guide[j + 1]]`` for ``j = floor(x * G)``.

    u (n, F) float64 uniforms in [0, 1); cdf (head,) float64 the normalised cumulative weights of the
    first ``head`` ranks; guide: ``guide_table(cdf, G)``; ranks past the head (``n_vocab > head``,
    u >= p_head) follow the continuous law of mass ``total`` (``hps.data._synthetic._Zipf``); rank
    ``min(k, n_vocab - 1) + drift``. keys (n, F) uint64: ``make_keys(f, rank)`` (``shift`` =
    FIELD_SHIFT); z (n, F) float64: ``ztab[f, rank]`` where the rank is below ``ztab.shape[1]``; the
    flat indices of the others go to ``miss`` (n * F,) int64 and the two uniforms of their planted
    normals (``hps.data._synthetic.planted_normal``, its integer part: seed ``seed_mix`` = mix64(seed)
    and ``salt``) to ``u1``, ``u2`` (n * F,) float64, for NumPy to finish. Returns how many.

    The guide cell (4 MiB of them) and the planted normal (``ztab``, 1 MiB) of the draw a row ahead
    are prefetched: they are read at random, and were the kernel's two main stalls with the cdf's
    binary search (by ``perf`` on the 2-core VM); with the hints the kernel took ~135 ms instead of
    ~200 for the 5.2 M draws of 200 k rows of 26 fields (thread time, on the shared machine).
    """
    n, n_fields = u.shape
    low = np.uint64(64 - shift)
    a_pow = (cdf.shape[0] + 1.0) ** (1.0 - s)
    n_cached = np.uint64(ztab.shape[1])
    g = guide.shape[0] - 1
    for i in range(n):  # two loops: with the hashing in the searching loop it runs 1.5x slower
        for f in range(n_fields):
            if i + 1 < n:  # the guide cell of the draw a row ahead: the misses of a row overlap
                prefetch(guide, int(u[i + 1, f] * g))
            keys[i, f] = np.uint64(_rank(u[i, f], cdf, guide, n_vocab, p_head, total, s, a_pow)) + drift
    n_miss = 0
    for i in range(n):
        for f in range(n_fields):
            if i + 1 < n and keys[i + 1, f] < n_cached:  # the planted normal a row ahead
                prefetch(ztab[f], keys[i + 1, f])
            r = keys[i, f]
            key = (np.uint64(f) << np.uint64(shift)) | (mix64(r) >> low)
            keys[i, f] = key
            if r < n_cached:
                z[i, f] = ztab[f, r]
            else:
                h1 = mix64(key ^ salt ^ seed_mix)
                h2 = mix64(h1 ^ salt)
                miss[n_miss] = i * n_fields + f
                u1[n_miss] = (np.float64(h1 >> np.uint64(11)) + 0.5) * 2.0 ** -53
                u2[n_miss] = np.float64(h2 >> np.uint64(11)) * 2.0 ** -53
                n_miss += 1
    return n_miss
