"""CPU kernels of the open-addressing hash table (the twin of ``_cuda_kernels.py``; the
two-phase ``slot_order``/``claim_hidden``/``publish`` serve :class:`hps._index.KeyIndex` only).

Layout, shared with the GPU kernels (see ``hps/table.py`` for the contract):

- ``tkeys`` (S,) uint64: the key of each slot, ``EMPTY`` (all ones) where no key ever lived.
- ``tstate`` (S,) int32: ``0`` live, ``1`` erased (a tombstone that keeps its key, so probe chains
  stay intact; only the same key revives it).
- ``tvals`` (S, dim) float: the row of each slot. Invariant: every slot that is not live holds zeros,
  so a claimed or revived slot starts from zeros without being written.

Linear probing from ``mix64(key) & (S - 1)``; ``S`` is a power of two. Kernels only; no state.

The kernels that allocate nothing are compiled with ``_nrt=False``, as ``hps/mem/_cache_kernels.py``'s:
with Numba's reference counting on, the array arguments of the inlined helpers (``_probe``,
``_find_or_claim``, the hash-once ring's ``ring_next``) keep atomic incref/decref pairs in the per-key
loop. On an 8 M-slot table, 1 M live, 400 k keys: ``upsert`` 92-104 -> 46-53 ns a key, ``claim``
(with the ring) 24-26 -> 13-14 (thread time on the shared 2-core VM, 2026-11-27: indicative).
"""

from __future__ import annotations

import numpy as np

from .._hashing import mix64
from .._jit import njit
from .._prefetch import home_ahead, prefetch, prefetch_ahead, ring_next, ring_start


@njit(nogil=True, cache=True, inline="always")
def _probe(tkeys, mask, key):
    """Slot holding ``key`` (live or tombstone), else -(1 + first empty slot), else -(S + 1) if full."""
    return _probe_from(tkeys, mask, key, mix64(key) & mask)


@njit(nogil=True, cache=True, inline="always")
def _probe_from(tkeys, mask, key, s):
    """:func:`_probe` from ``key``'s home slot ``s`` (``mix64(key) & mask``, computed by the caller)."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    n_slots = mask + np.uint64(1)
    for _ in range(tkeys.shape[0]):
        k = tkeys[s]
        if k == key:
            return np.int64(s)
        if k == empty:
            return -np.int64(s) - 1
        s = (s + np.uint64(1)) & mask
    return -np.int64(n_slots) - 1


@njit(nogil=True, cache=True, inline="always")
def _find_or_claim(tkeys, tstate, mask, key, h):
    """(slot, status) of ``key`` probed from its home slot ``h``: status 0 it was live, 1 it claimed an
    empty slot, 2 it revived its tombstone; slot -1 (status 0) when the table has no free slot."""
    s = _probe_from(tkeys, mask, key, h)
    if s < -np.int64(tkeys.shape[0]):
        return np.int64(-1), np.int8(0)
    if s < 0:
        s = -s - 1
        tkeys[s] = key
        return s, np.int8(1)
    if tstate[s] != 0:
        tstate[s] = 0
        return s, np.int8(2)
    return s, np.int8(0)


@njit(nogil=True, cache=True, _nrt=False)
def upsert(tkeys, tstate, tvals, keys, rows, accumulate):
    """Insert-or-assign (``accumulate`` False: later duplicates win) or insert-or-add.

    REQUIRES: the caller checked there is room for every key.
    Returns (n_new, n_revived): keys new to the table, of which n_revived reused their tombstone."""
    mask = np.uint64(tkeys.shape[0] - 1)
    n_new = 0
    n_revived = 0
    for i in range(keys.shape[0]):
        s, status = _find_or_claim(tkeys, tstate, mask, keys[i], mix64(keys[i]) & mask)
        n_new += status != 0
        n_revived += status == 2
        if accumulate:
            for j in range(tvals.shape[1]):
                tvals[s, j] += rows[i, j]
        else:
            for j in range(tvals.shape[1]):
                tvals[s, j] = rows[i, j]
    return n_new, n_revived


@njit(nogil=True, cache=True, _nrt=False)
def claim(tkeys, tstate, keys, slots, is_new, ring):
    """Find or claim a slot for every key without touching rows; home slots hashed once and
    prefetched R keys ahead (``ring`` (R,) uint64 scratch, ``hps._prefetch.ahead_ring``).

    slots (n,) int64 out: the slot, -1 where the table had no free slot. is_new (n,) int8 out:
    1 claimed an empty slot, 2 revived a tombstone, 0 already live.
    Returns (n_new, n_revived, n_failed); n_new counts revived keys too."""
    mask = np.uint64(tkeys.shape[0] - 1)
    n_new = 0
    n_revived = 0
    n_failed = 0
    ring_start(tkeys, tstate, keys, ring)
    for i in range(keys.shape[0]):
        s, status = _find_or_claim(tkeys, tstate, mask, keys[i], ring_next(tkeys, tstate, keys, i, ring))
        slots[i] = s
        is_new[i] = status
        n_failed += s < 0
        n_new += status != 0
        n_revived += status == 2
    return n_new, n_revived, n_failed


@njit(nogil=True, cache=True)
def rollback(tkeys, tstate, slots, is_new):
    """Undo a ``claim``: empty what it claimed, re-bury what it revived (rows were never written)."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    for i in range(slots.shape[0]):
        if is_new[i] == 1:
            tkeys[slots[i]] = empty
        elif is_new[i] == 2:
            tstate[slots[i]] = 1


@njit(nogil=True, cache=True, _nrt=False)
def move_rows(src, src_slots, dst, dst_slots):
    """``dst[dst_slots[i]] = src[src_slots[i]]`` for each i: rows copied between two slot arrays."""
    for i in range(src_slots.shape[0]):
        for j in range(src.shape[1]):
            dst[dst_slots[i], j] = src[src_slots[i], j]


@njit(nogil=True, cache=True)
def write(tvals, slots, rows, accumulate):
    """Assign (later duplicates win) or add ``rows`` (n, dim) into the claimed ``slots`` (n,)."""
    for i in range(slots.shape[0]):
        s = slots[i]
        if accumulate:
            for j in range(tvals.shape[1]):
                tvals[s, j] += rows[i, j]
        else:
            for j in range(tvals.shape[1]):
                tvals[s, j] = rows[i, j]


@njit(nogil=True, cache=True)
def get(tkeys, tstate, tvals, keys, out, found, slots, tombstones):
    """out (n, dim) gets each live key's row, zeros otherwise; found (n,) bool, or (0,) for none;
    slots (n,) int64 the slot of each live key, -1 otherwise, or (0,) for none. ``tombstones`` False
    promises there are none, which saves reading ``tstate`` (one cache miss per key). The sentinel key
    is never live. Home slots are hashed once and prefetched, with their rows, ``prefetch_ahead()``
    keys ahead (the hash-once ring; on an 8 M-slot table, 1 M live, 400 k present keys: 50 -> 41 ns a
    key, thread time on the shared 2-core VM, 2026-11-27: indicative, not a benchmark). Its ring is
    allocated here and its loop written out: with the ring an argument (``_nrt=False``, as ``claim``)
    it took ~50 ns again, and with ``ring_start``/``ring_next`` under reference counting ~130."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    mask = np.uint64(tkeys.shape[0] - 1)
    with_found, with_slots = found.shape[0] > 0, slots.shape[0] > 0
    ring = np.empty(prefetch_ahead(), dtype=np.uint64)  # this kernel's own: see the docstring
    n, ahead = keys.shape[0], ring.shape[0]
    for i in range(min(ahead, n)):
        prefetch(tvals, home_ahead(tkeys, keys, i, ring))
    for i in range(n):
        h = ring[i & (ahead - 1)]
        if i + ahead < n:
            prefetch(tvals, home_ahead(tkeys, keys, i + ahead, ring))
        s = _probe_from(tkeys, mask, keys[i], h)
        live = s >= 0 and keys[i] != empty and (not tombstones or tstate[s] == 0)
        if with_found:
            found[i] = live
        if with_slots:
            slots[i] = s if live else -1
        if live:
            for j in range(tvals.shape[1]):
                out[i, j] = tvals[s, j]
        else:
            for j in range(tvals.shape[1]):
                out[i, j] = 0


@njit(nogil=True, cache=True)
def write_at(tkeys, tstate, tvals, keys, slots, rows, tombstones):
    """Assign ``rows`` (n, dim) to ``keys`` (n,) at ``slots`` (n,) int64 that :func:`get` found for them,
    all or nothing: returns how many slots no longer hold their key live (a slot outside the table or
    -1, the sentinel key, the table re-laid or the key erased since), and writes no row unless that is
    0. ``tombstones`` as in :func:`get`. Later duplicates win."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    n_slots = tkeys.shape[0]
    n_stale = 0
    for i in range(keys.shape[0]):
        s = slots[i]
        if s < 0 or s >= n_slots or keys[i] == empty or tkeys[s] != keys[i] or (tombstones and tstate[s] != 0):
            n_stale += 1
    if n_stale:
        return n_stale
    for i in range(keys.shape[0]):
        s = slots[i]
        for j in range(tvals.shape[1]):
            tvals[s, j] = rows[i, j]
    return 0


@njit(nogil=True, cache=True, _nrt=False)
def contains(tkeys, tstate, keys, found, tombstones):
    mask = np.uint64(tkeys.shape[0] - 1)
    for i in range(keys.shape[0]):
        s = _probe(tkeys, mask, keys[i])
        found[i] = s >= 0 and (not tombstones or tstate[s] == 0)


@njit(nogil=True, cache=True, _nrt=False)
def erase(tkeys, tstate, tvals, tscore, keys):
    """Turn live keys into tombstones with zeroed rows and scores (``tscore`` (S,) uint64, the cache
    scores of ``_cache.py``, or (0,) for a table without them). Returns how many were live
    (duplicates count once)."""
    mask = np.uint64(tkeys.shape[0] - 1)
    n = 0
    for i in range(keys.shape[0]):
        s = _probe(tkeys, mask, keys[i])
        if s >= 0 and tstate[s] == 0:
            tstate[s] = 1
            if tscore.shape[0]:
                tscore[s] = 0
            for j in range(tvals.shape[1]):
                tvals[s, j] = 0
            n += 1
    return n


@njit(nogil=True, cache=True)
def live_slots(tkeys, tstate):
    """Slots (m,) int64 of every live entry, in slot order."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    n = 0
    for s in range(tkeys.shape[0]):
        if tkeys[s] != empty and tstate[s] == 0:
            n += 1
    out = np.empty(n, dtype=np.int64)
    n = 0
    for s in range(tkeys.shape[0]):
        if tkeys[s] != empty and tstate[s] == 0:
            out[n] = s
            n += 1
    return out


@njit(nogil=True, cache=True)
def slot_order(keys, mask, shift, order, skeys):
    """Stable counting sort of ``keys`` by home slot ``(mix64(key) & mask) >> shift``: order (n,) int64
    out gets the positions in that order, skeys (n,) out the keys. A kernel walking ``skeys`` probes
    the table in ascending slot order (sequential memory traffic instead of one miss per array per
    key); equal keys keep their relative order, so "later duplicates win" still holds."""
    nb = np.int64(mask >> shift) + 1
    counts = np.zeros(nb + 1, dtype=np.int64)
    for i in range(keys.shape[0]):
        counts[np.int64((mix64(keys[i]) & mask) >> shift) + 1] += 1
    for b in range(1, nb + 1):
        counts[b] += counts[b - 1]
    for i in range(keys.shape[0]):
        b = np.int64((mix64(keys[i]) & mask) >> shift)
        order[counts[b]] = i
        skeys[counts[b]] = keys[i]
        counts[b] += 1


@njit(nogil=True, cache=True, _nrt=False)
def claim_hidden(tkeys, tstate, keys, slots):
    """Find or claim a slot for every key, invisibly: a key not in the table claims an empty slot as
    a tombstone (lookups miss it); live keys and tombstones keep their state. slots (n,) int64 out.
    REQUIRES: room for every key. Returns the number of slots claimed (new tombstones)."""
    mask = np.uint64(tkeys.shape[0] - 1)
    n = 0
    for i in range(keys.shape[0]):
        s = _probe(tkeys, mask, keys[i])
        if s < 0:
            s = -s - 1
            tkeys[s] = keys[i]
            tstate[s] = 1
            n += 1
        slots[i] = s
    return n


@njit(nogil=True, cache=True)
def publish(tstate, tvals, slots, rows, old, had):
    """Write ``rows`` (n, dim) into ``slots`` from ``claim_hidden``, reviving tombstones (later
    duplicates win); old (n, dim) / had (n,) out: what each slot held just before this write.
    Returns the number of tombstones revived (keys new to the table)."""
    n = 0
    for i in range(slots.shape[0]):
        s = slots[i]
        had[i] = tstate[s] == 0
        if not had[i]:
            tstate[s] = 0
            n += 1
        for j in range(tvals.shape[1]):
            old[i, j] = tvals[s, j]
            tvals[s, j] = rows[i, j]
    return n
