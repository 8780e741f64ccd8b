"""CPU kernels of the HBM-PS as a cache across batches (the twin of ``_cache_kernels_cuda.py``; policy
in ``_cache.py``): ``tscore`` (S,) uint64 = ``(count << 32) | last batch``, 0 where no key is live.

Invariant: a slot whose score is not 0 is live (a use makes the count >= 1; every call that ends a
key's life, ``erase``/``erase_slots``/``zero_slots``/``clear``, zeroes its score; a re-lay carries
live scores only). The one exception, slots hidden with their scores (``CpuTableImpl.hide``), lasts
within one call holding the table's lock (an eviction's sink, an insert's fill), so no kernel here
sees it. A live slot may still score 0 (a key inserted and never looked up): ``lookup`` and
``victim_slots`` read the state where the score does not settle it.

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
    use (``_use``) in batch ``batch``. A slot whose key matches and whose score is not 0 is live (the
    invariant of the module docstring), so ``tstate`` is read only for unscored matches and not
    prefetched: two arrays a key instead of three (8 M slots, 3.3 M live, 450 k keys, 2/3 live: median
    26.4 -> 21.1 ms, 9 interleaved calls, thread time on the shared 2-core VM, 2026-11-27: indicative)."""
    mask = np.uint64(tkeys.shape[0] - 1)
    b = np.uint64(batch)
    n, ahead = keys.shape[0], prefetch_ahead()
    for i in range(min(ahead, n)):
        prefetch_home(tkeys, keys[i])
        prefetch_home(tscore, keys[i])
    for i in range(n):
        if i + ahead < n:  # hints: never fault
            prefetch_home(tkeys, keys[i + ahead])
            prefetch_home(tscore, keys[i + ahead])
        s = _probe(tkeys, mask, keys[i])
        if s >= 0 and (tscore[s] != 0 or tstate[s] == 0):
            slots[i] = s
            _use(tscore, s, b)
        else:
            slots[i] = -1


@njit(nogil=True, cache=True, _nrt=False)
def missing_keys(keys, slots, out):
    """The keys whose slot is -1 (``lookup``'s misses) into ``out`` (n,) uint64, in input order -> how
    many. Branch-free (each key is written, the count moves past a miss): a residency lookup's misses
    are about half its keys, at random, where NumPy's ``keys[slots < 0]`` mispredicts (350 k keys,
    45 % missing: 3.0-4.5 -> 0.7-2.1 ms, thread time on the shared 2-core VM, 2026-11-27)."""
    m = 0
    for i in range(keys.shape[0]):
        out[m] = keys[i]
        m += slots[i] < 0
    return m


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


@njit(nogil=True, cache=True, inline="always")
def _first_digit(score, base):
    """The first digit (0..65535) of a ``score``: ``min(count, 255) * 256 + clip(last - base, 0, 255)``,
    65535 from a count of 255 up: monotone in the score (a smaller score never has a larger digit), and
    one score per digit when the counts are below 255 and the last batches among the 256 before the
    protected one (``base`` (int64) = protect - 256), so one pass over the table mostly settles the
    threshold score (a job's counts are its few batches of use; its evictions look at recent ones)."""
    cnt = np.int64(min(score >> np.uint64(32), np.uint64(255)))
    last = min(max(np.int64(score & np.uint64(0xFFFFFFFF)) - base, 0), 255)
    return cnt * 256 + last if cnt < 255 else 65535


@njit(nogil=True, cache=True, inline="always")
def _eligible(tkeys, tstate, tscore, s, p, scored):
    """Slot ``s`` holds a live key last used before batch ``p`` (uint64). ``scored`` True promises every
    live slot scores above 0 (``CpuTableImpl.unscored`` False), so the score alone says a slot is live
    (the module docstring's invariant) and ``tkeys``/``tstate`` are not read."""
    if scored:
        return (tscore[s] != np.uint64(0)) & ((tscore[s] & np.uint64(0xFFFFFFFF)) < p)
    return ((tkeys[s] != np.uint64(0xFFFFFFFFFFFFFFFF)) & (tstate[s] == 0)
            & ((tscore[s] & np.uint64(0xFFFFFFFF)) < p))


@njit(nogil=True, cache=True)
def _first_hist(tkeys, tstate, tscore, p, base, scored, g, near):
    """(hist (65537,) int64, r): the eligible slots by ``_first_digit``, the others in bin 65536
    (``scored``: as ``_eligible``); the eligible slots of digit <= ``g`` appended to ``near`` (c + 1,)
    int64 while they fit, r how many there were (> c: they did not fit). Four histograms side by side,
    slot ``s`` in the ``s % 4``-th, so runs of equal digits do not wait on one counter, and no branch:
    one streaming pass over the slot arrays."""
    hist = np.zeros((4, 65537), np.int64)
    S, c, r = tkeys.shape[0], near.shape[0] - 1, 0
    for s0 in range(0, S - S % 4, 4):
        for j in range(4):
            s = s0 + j
            d = _first_digit(tscore[s], base)
            ok = _eligible(tkeys, tstate, tscore, s, p, scored)
            hist[j, d if ok else 65536] += 1
            near[min(r, c)] = s
            r += ok & (d <= g)
    for s in range(S - S % 4, S):
        d = _first_digit(tscore[s], base)
        ok = _eligible(tkeys, tstate, tscore, s, p, scored)
        hist[0, d if ok else 65536] += 1
        near[min(r, c)] = s
        r += ok & (d <= g)
    return hist[0] + hist[1] + hist[2] + hist[3], r


@njit(nogil=True, cache=True, inline="always")
def _pick(hist, k):
    """(b, rank): the bin ``b`` holding the ``k``-th (1-based) smallest of a histogram, and its rank
    among that bin's items."""
    seen = 0
    for b in range(hist.shape[0]):
        if seen + hist[b] >= k:
            return b, k - seen
        seen += hist[b]
    return hist.shape[0] - 1, k - seen


@njit(nogil=True, cache=True)
def _smallest(tkeys, tscore, cand, k, out, j):
    """Append to ``out`` from ``j`` the ``k`` (1 <= k <= len) candidate slots ``cand`` (r,) int64 of
    smallest ``(score, key)``, -> the new ``j``. A radix select: 16-bit digits of ``value - min`` from the
    highest bit the candidates differ in, over the scores until the candidates share one, then over the
    keys; each pass appends the candidates below the chosen digit and keeps (in place) those in it."""
    r = cand.shape[0]
    val = tscore[cand]
    hist = np.zeros(65536, np.int64)
    on_keys = False
    while k < r:
        lo, hi = val[0], val[0]
        for i in range(r):
            lo, hi = min(lo, val[i]), max(hi, val[i])
        if lo == hi:
            if on_keys:  # keys are distinct: not reached while they are
                break
            on_keys = True
            for i in range(r):
                val[i] = tkeys[cand[i]]
            continue
        shift = np.uint64(0)
        while (hi - lo) >> shift >= np.uint64(65536):
            shift += np.uint64(1)
        hist[:] = 0
        for i in range(r):
            hist[np.int64((val[i] - lo) >> shift)] += 1
        b, k = _pick(hist, k)
        bb = np.uint64(b)
        w = 0
        for i in range(r):
            d = (val[i] - lo) >> shift
            if d < bb:
                out[j] = cand[i]
                j += 1
            elif d == bb:
                cand[w], val[w] = cand[i], val[i]
                w += 1
        r = w
    for i in range(k):
        out[j] = cand[i]
        j += 1
    return j


#: Digits past the last call's threshold that ``victim_slots``' first pass gathers (its threshold moves
#: little from one eviction to the next: digits count batches back from the protected one).
NEAR_DIGITS = 2


@njit(nogil=True, cache=True)
def victim_slots(tkeys, tstate, tscore, protect, n, scored, hint):
    """Slots (k,) int64 of the k = min(n, eligible) live slots last used before batch ``protect``
    with the smallest ``(score, key)`` (keys are distinct: the set is exact), in no particular order.

    A radix select, not a sort: one pass histograms the eligible slots by ``_first_digit`` of their
    score; the slots of the digits below the one holding the n-th smallest are victims, and that
    digit's slots are narrowed by score then key (``_smallest``): no sort, work in the size of one
    digit (a partition of every eligible score and two more passes made a table of 8 M slots cost
    ~120 ms an eviction). Those slots come from the first pass itself when they are among the ones it
    gathered (``hint`` (1,) int64: in, the digit of the last call's threshold, -1 for none; the pass
    gathers the eligible slots up to ``NEAR_DIGITS`` past it, at most ``4 n + 65536``; out, this call's
    threshold digit), else from a second streaming pass over the slots. ``scored`` True promises that
    every live slot scores above 0 (``_eligible``): the passes read the scores alone, 8 bytes a slot
    instead of 20. On 8 M slots, 3.3 M live, 150 k victims (the 2 M-row ``bench_host`` job's shape):
    median 63 -> 46 ms an eviction, 9 interleaved calls (thread time on the shared 2-core VM,
    2026-11-27: indicative)."""
    p = np.uint64(protect)
    base = np.int64(protect) - 256
    g = hint[0] + NEAR_DIGITS if hint[0] >= 0 else -1
    near = np.empty(min(4 * max(n, 0) + 65536, tkeys.shape[0]) + 1, np.int64)
    hist, r_near = _first_hist(tkeys, tstate, tscore, p, base, scored, g, near)
    m = hist[:65536].sum()
    take = min(max(n, 0), m)
    if take == 0:
        return np.empty(0, np.int64)
    b, k = (65535, hist[65535]) if take == m else _pick(hist[:65536], take)
    hint[0] = b
    out = np.empty(take + 1, np.int64)   # + 1: every slot is written, the count moves when it is one
    cand = np.empty(hist[b] + 1, np.int64)
    j, r = 0, 0
    if b <= g and r_near < near.shape[0]:   # every eligible slot of digit <= b was gathered
        for i in range(r_near):
            s = near[i]
            d = _first_digit(tscore[s], base)
            out[j] = s
            j += d < b
            cand[r] = s
            r += d == b
    else:
        for s in range(tkeys.shape[0]):
            d = _first_digit(tscore[s], base)
            ok = _eligible(tkeys, tstate, tscore, s, p, scored)
            out[j] = s
            j += ok & (d < b)
            cand[r] = s
            r += ok & (d == b)
    j = _smallest(tkeys, tscore, cand[:r], k, out, j)
    return out[:j]


@njit(nogil=True, cache=True, _nrt=False)
def any_unscored(tkeys, tstate, tscore):
    """Some live slot scores 0 (``victim_slots``' ``scored`` False)."""
    for s in range(tkeys.shape[0]):
        if tscore[s] == 0 and tkeys[s] != np.uint64(0xFFFFFFFFFFFFFFFF) and tstate[s] == 0:
            return True
    return False


@njit(nogil=True, cache=True)
def erase_slots(tstate, tvals, tscore, slots):
    """Slots (m,) of live, distinct keys become tombstones with zeroed rows and scores."""
    for i in range(slots.shape[0]):
        s = slots[i]
        tstate[s] = 1
        tscore[s] = 0
        for j in range(tvals.shape[1]):
            tvals[s, j] = 0


@njit(nogil=True, cache=True, _nrt=False)
def zero_slots(tvals, tscore, slots):
    """The rows and scores of ``slots`` (m,) zeroed, their states not touched (slots hidden already:
    ``CpuTableImpl.hide``; the train step may read the states meanwhile)."""
    for i in range(slots.shape[0]):
        s = slots[i]
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
