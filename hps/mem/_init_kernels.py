"""Kernel of the deterministic per-key row initializer. Kernels only."""

from __future__ import annotations

import numpy as np

from .._hashing import mix64
from .._jit import njit
from .._prefetch import prefetch_ahead, prefetch_row_write


@njit(nogil=True, cache=True)
def init_rows(keys, at, seed, emb_dim, scale, state_value, out):
    """out[at[i], :emb_dim] uniform in [-scale, scale) from (keys[i], seed, column) only;
    out[at[i], emb_dim:] = state_value. keys (n,) uint64, at (n,) int64 rows of out, out (m, W)
    float32.

    The rows at ``prefetch_ahead()`` positions ahead are prefetched for writing: ``at`` is scattered
    when ``out`` is the CPU twin's slot array (the slots the keys claimed), and each row's
    read-for-ownership misses then overlap with the draws of the rows before it (on the shared 2-core
    VM, 600 k rows of 256 B into a 2 GiB array: ~100-150 ns a row before, ~50-60 after).

    A row's draws are two loops the compiler vectorises (AVX2): the hashes, each draw's 53 bits kept
    as two exact float64 halves (``_as_float_halves``: AVX2 has no uint64 -> float64 conversion, and a
    loop with one stays scalar), then the floats. ``hi * 2**32 + lo`` is the 53-bit integer exactly, so
    every value is the bit-identical ``float64(x >> 11)`` draw of before (thread time on the shared 2-core
    VM, 2026-11-27, indicative: 200 k rows into a contiguous array 97-118 -> 72-100 ns a row; 300 k rows
    scattered into a 2 GiB array, median 129 -> 121, where the rows' writes weigh most)."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    base = seed_base(seed)
    inv = 1.0 / 9007199254740992.0  # 2**-53
    two52, two32 = 4503599627370496.0, 4294967296.0
    fs = np.float32(scale)
    bhi, blo = np.empty(emb_dim, np.uint64), np.empty(emb_dim, np.uint64)
    fhi, flo = bhi.view(np.float64), blo.view(np.float64)
    n, ahead = keys.shape[0], prefetch_ahead()
    for i in range(min(ahead, n)):
        prefetch_row_write(out, at[i])
    for i in range(n):
        if i + ahead < n:
            prefetch_row_write(out, at[i + ahead])
        r = at[i]
        h = mix64(keys[i] ^ base)
        for j in range(emb_dim):
            _as_float_halves(mix64(h + np.uint64(j + 1) * golden) >> np.uint64(11), bhi, blo, j)
        for j in range(emb_dim):
            u = ((fhi[j] - two52) * two32 + (flo[j] - two52)) * inv  # [0, 1): float64(x >> 11) * 2**-53
            v = np.float32((2.0 * u - 1.0) * scale)
            if v >= fs:  # float32 rounding must not reach the open end
                v = -fs
            out[r, j] = v
        for j in range(emb_dim, out.shape[1]):
            out[r, j] = state_value


@njit(nogil=True, cache=True, inline="always")
def draw_bits(h, j):
    """The 53 random bits of column ``j`` of the key whose hash is ``h`` (``init_rows``' draw, which
    computes it inline so its loop vectorises); the device twin calls this one, so the simulator runs
    its uint64 arithmetic compiled, as the GPU does, not as NumPy scalars."""
    return mix64(h + np.uint64(j + 1) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(11)


@njit(nogil=True, cache=True, inline="always")
def seed_base(seed):
    """The hash every key's draws start from (``mix64(key ^ base)``): ``mix64(seed ^ a fixed salt)``;
    the device twin (``_init_kernels_cuda``) takes it from here."""
    return mix64(np.uint64(seed) ^ np.uint64(0xD1B54A32D192ED03))


@njit(nogil=True, cache=True, inline="always")
def _as_float_halves(x, bhi, blo, j):
    """``x`` (< 2**53) as the bits of two float64 ``2**52 + x // 2**32`` and ``2**52 + x % 2**32``, in
    ``bhi[j]`` and ``blo[j]`` (uint64 arrays that float64 views read): each half is below 2**52, so the
    exponent's bits and the half OR-ed together are that float exactly."""
    magic = np.uint64(0x4330000000000000)   # the bits of 2**52
    bhi[j] = (x >> np.uint64(32)) | magic
    blo[j] = (x & np.uint64(0xFFFFFFFF)) | magic


@njit(nogil=True, cache=True)
def in_row_order(keys, at, shift, counts, skeys, sat):
    """A stable counting sort of (``keys``, ``at``) (n,) by ``at >> shift`` (at int64 >= 0): skeys, sat
    (n,) out get them in that order; counts ((max(at) >> shift) + 2,) int64 zeroed, scratch.
    Returns False, leaving skeys and sat unwritten, when ``at`` is in that order already (one pass)."""
    n = at.shape[0]
    ordered = True
    for i in range(n):
        b = at[i] >> shift
        counts[b + 1] += 1
        if i and b < at[i - 1] >> shift:
            ordered = False
    if ordered:
        return False
    for b in range(1, counts.shape[0]):
        counts[b] += counts[b - 1]
    for i in range(n):
        b = at[i] >> shift
        j = counts[b]
        skeys[j] = keys[i]
        sat[j] = at[i]
        counts[b] = j + 1
    return True
