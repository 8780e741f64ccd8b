"""CPU kernels of the HBM-PS as a cache across batches (the twin of ``_cache_kernels_cuda.py``; policy
in ``_cache.py``): ``tscore`` (S,) uint64 = ``(count << 32) | last batch``, 0 where no key is live.

Kernels only, ``@njit(nogil=True, cache=True)``; every input is an argument.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit
from .._prefetch import prefetch, prefetch_ahead, prefetch_home
from ._cpu_kernels import _probe


@njit(nogil=True, cache=True, inline="always")
def _use(tscore, s, b):
    """Slot ``s``'s score counts one more use (saturating at 2**32 - 1), in batch ``b`` (uint64; the
    later of it and the score's last)."""
    low = np.uint64(0xFFFFFFFF)
    old = tscore[s]
    cnt = old >> np.uint64(32)
    last = old & low
    if b > last:
        last = b
    if cnt < low:
        cnt += np.uint64(1)
    tscore[s] = (cnt << np.uint64(32)) | last


@njit(nogil=True, cache=True)
def lookup(tkeys, tstate, tscore, keys, batch, slots):
    """slots (n,) int64 = the slot of each live key, -1 elsewhere; each live key's score counts one more
    use (``_use``) in batch ``batch``."""
    mask = np.uint64(tkeys.shape[0] - 1)
    b = np.uint64(batch)
    n, ahead = keys.shape[0], prefetch_ahead()
    for i in range(min(ahead, n)):
        prefetch_home(tkeys, keys[i])
        prefetch_home(tstate, keys[i])
        prefetch_home(tscore, keys[i])
    for i in range(n):
        if i + ahead < n:  # hints: never fault
            prefetch_home(tkeys, keys[i + ahead])
            prefetch_home(tstate, keys[i + ahead])
            prefetch_home(tscore, keys[i + ahead])
        s = _probe(tkeys, mask, keys[i])
        if s >= 0 and tstate[s] == 0:
            slots[i] = s
            _use(tscore, s, b)
        else:
            slots[i] = -1


@njit(nogil=True, cache=True)
def use_slots(tscore, slots, batch):
    """The score of each of the distinct ``slots`` (n,) int64 counts one use in batch ``batch``."""
    b = np.uint64(batch)
    n, ahead = slots.shape[0], prefetch_ahead()
    for i in range(min(ahead, n)):
        prefetch(tscore, slots[i])
    for i in range(n):
        if i + ahead < n:
            prefetch(tscore, slots[i + ahead])
        _use(tscore, slots[i], b)


@njit(nogil=True, cache=True)
def victim_slots(tkeys, tstate, tscore, protect, n):
    """Slots (k,) int64 of the k = min(n, eligible) live slots last used before batch ``protect``
    with the smallest ``(score, key)`` (keys are distinct: the set is exact), in no particular order.
    Selection, not a sort: the n-th smallest score by ``np.partition``, then among the slots of that
    very score the smallest keys the same way; O(eligible) (two sorts of every eligible slot made a
    table of 2 M live rows cost 0.85 s per eviction)."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    p = np.uint64(protect)
    low = np.uint64(0xFFFFFFFF)
    m = 0
    for s in range(tkeys.shape[0]):
        if tkeys[s] != empty and tstate[s] == 0 and (tscore[s] & low) < p:
            m += 1
    cand = np.empty(m, np.int64)
    m = 0
    for s in range(tkeys.shape[0]):
        if tkeys[s] != empty and tstate[s] == 0 and (tscore[s] & low) < p:
            cand[m] = s
            m += 1
    if n <= 0:
        return cand[:0].copy()
    if m <= n:
        return cand
    score = tscore[cand]
    t = np.partition(score, n - 1)[n - 1]   # the n-th smallest score
    below, tied = 0, 0
    for i in range(m):
        if score[i] < t:
            below += 1
        elif score[i] == t:
            tied += 1
    need = n - below                               # 1 <= need <= tied
    tkey = np.empty(tied, np.uint64)
    j = 0
    for i in range(m):
        if score[i] == t:
            tkey[j] = tkeys[cand[i]]
            j += 1
    kmax = np.partition(tkey, need - 1)[need - 1]  # the largest key of the tied ones taken
    out = np.empty(n, np.int64)
    j = 0
    for i in range(m):
        if score[i] < t or (score[i] == t and tkeys[cand[i]] <= kmax):
            out[j] = cand[i]
            j += 1
    return out


@njit(nogil=True, cache=True)
def erase_slots(tstate, tvals, tscore, slots):
    """Slots (m,) of live, distinct keys become tombstones with zeroed rows and scores."""
    for i in range(slots.shape[0]):
        s = slots[i]
        tstate[s] = 1
        tscore[s] = 0
        for j in range(tvals.shape[1]):
            tvals[s, j] = 0


@njit(nogil=True, cache=True)
def set_scores(tkeys, tscore, keys, scores):
    """The score of each key's slot = scores[i] (after a rebuild re-laid the keys)."""
    mask = np.uint64(tkeys.shape[0] - 1)
    for i in range(keys.shape[0]):
        s = _probe(tkeys, mask, keys[i])
        if s >= 0:
            tscore[s] = scores[i]
