"""CUDA kernels of the HBM-PS as a cache across batches: a score per slot and the choice of victims
on the device (the twin of ``_cache_kernels_cpu.py``; the policy is documented in ``_cache.py``).
The eligible slots are compacted by the table's ``live_entries``.

``tscore`` (S,) uint64 beside the slot arrays: ``(count << 32) | last batch``, 0 for a slot that holds
no live key. Kernels and device functions only; every constant is an argument or a literal. Launch
shapes as in ``_cuda_kernels.py`` (grid-stride; "1-D" one thread per item per round).

Victims are the ``n`` smallest live, unprotected slots in the order of ``(score, key)`` (keys are
distinct, so the order is total and the choice does not depend on the slot layout): the eligible
slots are compacted (``live_entries``), a radix select finds the ``n``-th smallest ``(score, key)`` in
16 passes of 8-bit digits (``radix_hist`` per pass, ``radix_pick`` reduces the 256 bins on one
thread), and ``select_upto`` compacts the candidates at or below it.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .._grid_kernels import row0, row_step
from ._cuda_kernels import _find

#: Radix select: digits of 8 bits, 8 passes over the score then 8 over the key.
DIGIT_BITS = 8
N_BINS = 256
N_PASSES = 16


@cuda.jit(device=True)
def _bump(tscore, s, batch):
    """Atomically ``tscore[s] = (min(count + 1, 2**32 - 1) << 32) | max(last, batch)`` (a CAS loop, so
    duplicates in one launch each count and the result does not depend on their order)."""
    low = np.uint64(0xFFFFFFFF)
    old = tscore[s]
    while True:
        cnt = old >> np.uint64(32)
        last = old & low
        if batch > last:
            last = batch
        if cnt < low:
            cnt = cnt + np.uint64(1)
        prev = cuda.atomic.cas(tscore, s, old, (cnt << np.uint64(32)) | last)
        if prev == old:
            return
        old = prev


@cuda.jit
def lookup(tkeys, tstate, tscore, keys, batch, slots):
    """1-D. slots (n,) int64 = the slot of each live key of keys (n,) uint64, -1 elsewhere; the score
    of each live key's slot counts one more use, in batch ``batch`` (uint64, below 2**32)."""
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        s = _find(tkeys, keys[i])
        if s >= 0 and tstate[s] == 0:
            slots[i] = s
            _bump(tscore, s, batch)
        else:
            slots[i] = np.int64(-1)


@cuda.jit(device=True)
def _digit(score, key, prefix, pas):
    """(matches, digit) of candidate (score, key) in pass ``pas``: whether its bits above this pass's
    digit equal ``prefix`` (2,) uint64 (the score's, then the key's), and the digit itself."""
    if pas < 8:
        shift = np.uint64(56 - 8 * pas)
        hi = score >> shift >> np.uint64(8)  # the bits above the digit (two shifts: 64 is undefined)
        ok = hi == (prefix[0] >> shift >> np.uint64(8))
        return ok, np.int64((score >> shift) & np.uint64(0xFF))
    shift = np.uint64(56 - 8 * (pas - 8))
    ok = score == prefix[0] and (key >> shift >> np.uint64(8)) == (prefix[1] >> shift >> np.uint64(8))
    return ok, np.int64((key >> shift) & np.uint64(0xFF))


@cuda.jit
def radix_hist(c_score, c_key, m, prefix, pas, hist):
    """1-D over the m (int64) candidates: hist (256,) int64 += the digits of pass ``pas`` of the candidates
    whose higher bits match ``prefix``; a block sums in shared memory first. REQUIRES: a 1-D block of
    at least 1 thread, every thread of the block runs; hist zeroed."""
    sh = cuda.shared.array(256, dtype=np.int64)
    for b in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
        sh[b] = 0
    cuda.syncthreads()
    for i in range(cuda.grid(1), m, cuda.gridsize(1)):
        ok, d = _digit(c_score[i], c_key[i], prefix, pas)
        if ok:
            cuda.atomic.add(sh, d, np.int64(1))
    cuda.syncthreads()
    for b in range(cuda.threadIdx.x, 256, cuda.blockDim.x):
        if sh[b] != 0:
            cuda.atomic.add(hist, b, sh[b])


@cuda.jit
def radix_pick(hist, prefix, rank, pas):
    """One thread: the digit of pass ``pas`` holding the ``rank[0]``-th smallest (1-based) matching
    candidate goes into ``prefix``; ``rank[0]`` becomes its rank among the candidates with that digit;
    ``hist`` is zeroed for the next pass."""
    if cuda.grid(1) != 0:
        return
    r = rank[0]
    seen = np.int64(0)
    chosen = np.int64(-1)
    for b in range(256):
        c = hist[b]
        if chosen < 0 and seen + c >= r:
            chosen = np.int64(b)
            rank[0] = r - seen
        seen += c
        hist[b] = 0
    if pas < 8:
        shift = np.uint64(56 - 8 * pas)
        prefix[0] = prefix[0] | (np.uint64(chosen) << shift)
    else:
        shift = np.uint64(56 - 8 * (pas - 8))
        prefix[1] = prefix[1] | (np.uint64(chosen) << shift)


@cuda.jit
def select_upto(c_score, c_key, c_slot, m, prefix, out_slot, counts):
    """1-D over the m candidates: the slots of those with ``(score, key) <= (prefix[0], prefix[1])`` go
    to out_slot, in no particular order; counts[0] += their number (thread tickets)."""
    for i in range(cuda.grid(1), m, cuda.gridsize(1)):
        sc = c_score[i]
        if sc < prefix[0] or (sc == prefix[0] and c_key[i] <= prefix[1]):
            q = cuda.atomic.add(counts, 0, np.int64(1))
            out_slot[q] = c_slot[i]


@cuda.jit
def erase_slots(tstate, tvals, tscore, slots):
    """Row kernel over the m slots (of live, distinct keys): tombstones with zeroed rows and scores."""
    for i in range(row0(), slots.shape[0], row_step()):
        s = slots[i]
        if cuda.threadIdx.x == 0:
            tstate[s] = np.int32(1)
            tscore[s] = np.uint64(0)
        for j in range(cuda.threadIdx.x, tvals.shape[1], cuda.blockDim.x):
            tvals[s, j] = 0


@cuda.jit
def set_scores(tkeys, tscore, keys, scores):
    """1-D. The score of each key's slot = scores[i] (after a rebuild re-laid the keys)."""
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        s = _find(tkeys, keys[i])
        if s >= 0:
            tscore[s] = scores[i]
