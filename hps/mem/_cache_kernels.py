"""Kernels of the MEM-PS row cache (``hps.mem.RowCache``): one operation per host method that
changes the policy's state. Kernels only; the state's layout and the policy's device functions
are in ``_policy_kernels``, the key -> slot map and the read-only kernels in ``_map_kernels``.

Performance note: the operation kernels that allocate nothing are compiled with ``_nrt=False``.
With Numba's reference counting on, the array arguments of the inlined helpers get atomic
incref/decref pairs inside the per-key loop that the refcount pruner does not remove; measured on
3,000 keys: 970 us with NRT, 86 us without (11x). Helpers are ``inline="always"`` for the same reason.
The operation kernels start with a pass of ``prefetch`` hints over the batch (map cells; ghost cells
in ``put``): a per-key body is a chain of dependent loads, so without them a cache miss stalls one
key at a time. Measured on the replay (alpha 0.8, 10 % cache): ``put`` 581 -> 370 us a batch,
``lookup`` 247 -> 175, ``unpin`` 224 -> 165 (with the heap the LFU part was then). ``put`` prefetches
``prefetch_ahead()`` keys ahead instead (a pass over a batch of 150 k evicted rows evicts its first
cells again before their probes), and more than the cells: the input row, the free slot the key will
take (``take`` left the stack's top scattered over the cache) with its row and state, and the LRU
rows the insertions will demote (``_lru_ahead``). On the replayed MEM-PS calls of the 2 M-row
``bench/bench_host.py`` job (1.7 M rows pushed in 12 calls), ``put`` 1.41-1.43 -> 1.02-1.13 s
(thread time, 3 pairs, shared 2-core VM). Kernels do no
bounds checks: the host sizes every array (see each kernel's REQUIRES). Kernels are not thread-safe;
the host serialises calls on one state.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit
from .._prefetch import prefetch, prefetch_ahead, prefetch_home, prefetch_row_write
from ._map_kernels import _ghost_cell, _ghost_tag, _map_del, _map_get, _map_put, _prefetch_map
from ._policy_kernels import (LRU_LIST, ST_CALL, ST_FREE_TOP, ST_N_PINNED, W_FREE, _detach, _evict_one, _place_lru,
                              _release, _resift, _visit)


@njit(nogil=True, cache=True, _nrt=False)
def lookup(st, skey, rows, pins, freq, where, stamp, prev, nxt, bkt, bhead, btail, mkeys, mvals,
           keys, counts, pin, out_rows, hit):
    """Hits: copy the row into ``out_rows[i]``, add ``counts[i]`` to its frequency, and (once per call
    per key) pin it or move it to the LRU's recent end. keys (n,) uint64, counts (n,) int64,
    out_rows (n, W), hit (n,) bool (written). Returns the number of distinct keys that hit."""
    st[ST_CALL] += 1
    call = st[ST_CALL]
    n_hit = 0
    _prefetch_map(mkeys, mvals, keys)
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        if s < 0:
            hit[i] = False
            continue
        hit[i] = True
        freq[s] += counts[i]
        for j in range(rows.shape[1]):
            out_rows[i, j] = rows[s, j]
        if stamp[s] == call:
            _resift(st, where, freq, prev, nxt, bkt, bhead, btail, s)
            continue
        stamp[s] = call
        n_hit += 1
        _visit(st, where, freq, prev, nxt, bkt, bhead, btail, pins, s, pin)
    return n_hit


@njit(nogil=True, cache=True, _nrt=False)
def put_check(st, pins, stamp, mkeys, mvals, keys, pin):
    """Budget check of ``put`` (no state change besides the call stamp).
    Returns (n_new, working_set): working_set = rows pinned after the call when ``pin``, else
    n_pinned + n_new (the call fails when it exceeds the capacity and n_new > 0)."""
    st[ST_CALL] += 1
    call = st[ST_CALL]
    n_new = 0
    n_old = 0
    n_old_pinned = 0
    _prefetch_map(mkeys, mvals, keys)
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        if s < 0:
            n_new += 1
        elif stamp[s] != call:
            stamp[s] = call
            n_old += 1
            if pins[s] > 0:
                n_old_pinned += 1
    if pin:
        return n_new, st[ST_N_PINNED] - n_old_pinned + n_old + n_new
    return n_new, st[ST_N_PINNED] + n_new


@njit(nogil=True, cache=True, inline="always")
def _prefetch_links(freq, where, prev, nxt, bkt, s):
    """Prefetch the list links, place and frequency of slot ``s`` (none when ``s`` < 0)."""
    if s >= 0:
        prefetch(freq, s)
        prefetch(where, s)
        prefetch(prev, s)
        prefetch(nxt, s)
        prefetch(bkt, s)


@njit(nogil=True, cache=True, inline="always")
def _prefetch_put(rows, skey, dirty, pins, freq, where, stamp, prev, nxt, bkt, free, mkeys, mvals, ghost,
                  keys, in_rows, in_at, pick, top, i):
    """Prefetch what :func:`put` touches of ``keys[i]``, ``top`` new keys before its turn (``top``: the
    free stack's top then, if every key between is new): its home map cell (key and slot), its ghost
    cell, its input row, and the free slot it would take, that slot's row (for writing) and state.
    The free stack's top is slots ``take`` freed, scattered over the cache: without this, each new
    key stalls on a dozen cache misses one after another (its state arrays and its row)."""
    key = keys[i]
    prefetch_home(mkeys, key)
    prefetch_home(mvals, key)
    if ghost.shape[0] > 0:
        prefetch(ghost, _ghost_cell(ghost, key))
    r = in_at[i] if pick else i
    prefetch_row_write(in_rows, r)
    if top > 0:
        s = np.int64(free[top - 1])
        prefetch_row_write(rows, s)
        prefetch(skey, s)
        prefetch(stamp, s)
        prefetch(dirty, s)
        prefetch(pins, s)
        _prefetch_links(freq, where, prev, nxt, bkt, s)


@njit(nogil=True, cache=True, inline="always")
def _lru_ahead(bhead, nxt, ahead):
    """The row ``ahead`` places after the LRU part's least recent one (-1 when the part is shorter), its
    links prefetched on the way: each row a visit puts in the LRU part demotes its least recent row
    to the LFU part (an unlink of it and its successor, cold), so a kernel that visits one row a key
    walks this cursor one row a key and prefetches each row's links ``ahead`` demotions early."""
    cur = bhead[LRU_LIST]
    for _ in range(ahead):
        if cur < 0:
            break
        cur = nxt[cur]
    return cur


@njit(nogil=True, cache=True, _nrt=False)
def put(st, skey, rows, dirty, pins, freq, where, stamp, prev, nxt, bkt, bhead, btail, free, mkeys, mvals,
        ghost, keys, in_rows, in_at, in_dirty, in_freq, pin,
        ev_keys, ev_rows, ev_dirty, ev_freq):
    """Insert or assign rows; evicts into ``ev_*`` as needed. REQUIRES: ``put_check`` passed.
    keys (n,) uint64, in_rows (m, W) holding the row of ``keys[i]`` at ``in_at[i]`` (``in_at`` (n,)
    int64 in bounds; empty: at ``i``, m = n), in_dirty (n,) bool, in_freq (n,) int64; ``ev_*`` have
    room for n rows (not only the new keys: without pins a call may evict its own keys and re-insert
    them). Returns the number of evicted rows."""
    st[ST_CALL] += 1
    call = st[ST_CALL]
    n_ev = 0
    pick = in_at.shape[0] > 0
    n, ahead = keys.shape[0], prefetch_ahead()
    for i in range(min(ahead, n)):
        _prefetch_put(rows, skey, dirty, pins, freq, where, stamp, prev, nxt, bkt, free, mkeys, mvals, ghost,
                      keys, in_rows, in_at, pick, st[ST_FREE_TOP] - i, i)
    cur = _lru_ahead(bhead, nxt, ahead)
    for i in range(n):
        if i + ahead < n:
            _prefetch_put(rows, skey, dirty, pins, freq, where, stamp, prev, nxt, bkt, free, mkeys, mvals, ghost,
                          keys, in_rows, in_at, pick, st[ST_FREE_TOP] - ahead, i + ahead)
        if cur >= 0:
            cur = nxt[cur]   # prefetched a key ago
            _prefetch_links(freq, where, prev, nxt, bkt, cur)
        key = keys[i]
        s = _map_get(mkeys, mvals, key)
        if s < 0:
            if st[ST_FREE_TOP] == 0:
                _evict_one(st, skey, rows, dirty, freq, where, prev, nxt, bkt, bhead, btail, free,
                           mkeys, mvals, ghost, ev_keys, ev_rows, ev_dirty, ev_freq, n_ev)
                n_ev += 1
            st[ST_FREE_TOP] -= 1
            s = np.int64(free[st[ST_FREE_TOP]])
            _map_put(mkeys, mvals, key, s)
            skey[s] = key
            f = in_freq[i]
            if ghost.shape[0] > 0:
                c = _ghost_cell(ghost, key)
                if ghost[c, 0] == _ghost_tag(key):
                    f += np.int64(ghost[c, 1])
                    ghost[c, 0] = np.uint64(0)
            freq[s] = f
            dirty[s] = in_dirty[i]
            pins[s] = 0
            where[s] = W_FREE
            stamp[s] = 0
        else:
            freq[s] += in_freq[i]
            dirty[s] = dirty[s] or in_dirty[i]
        r = in_at[i] if pick else i
        for j in range(rows.shape[1]):
            rows[s, j] = in_rows[r, j]
        if stamp[s] == call:
            _resift(st, where, freq, prev, nxt, bkt, bhead, btail, s)
            continue
        stamp[s] = call
        _visit(st, where, freq, prev, nxt, bkt, bhead, btail, pins, s, pin)
    return n_ev


@njit(nogil=True, cache=True, _nrt=False)
def make_room(st, skey, rows, dirty, freq, where, prev, nxt, bkt, bhead, btail, free, mkeys, mvals,
              ghost, n_free, ev_keys, ev_rows, ev_dirty, ev_freq):
    """Evict until ``n_free`` slots are free. REQUIRES: n_free <= C - n_pinned. Returns n evicted."""
    n_ev = 0
    while st[ST_FREE_TOP] < n_free:
        _evict_one(st, skey, rows, dirty, freq, where, prev, nxt, bkt, bhead, btail, free,
                   mkeys, mvals, ghost, ev_keys, ev_rows, ev_dirty, ev_freq, n_ev)
        n_ev += 1
    return n_ev


@njit(nogil=True, cache=True, _nrt=False)
def discard(st, skey, dirty, pins, freq, where, prev, nxt, bkt, bhead, btail, free, mkeys, mvals, ghost,
            keys):
    """Remove cached, unpinned ``keys`` (n,) uint64 without handing their rows back (deleted keys):
    slots go on the free stack, ghost cells naming them are cleared. Absent keys are skipped.
    REQUIRES: no key is pinned. Returns the number of keys removed."""
    n = 0
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        if s < 0:
            continue
        _detach(st, where, prev, nxt, bkt, bhead, btail, s)
        _map_del(mkeys, mvals, keys[i])
        if ghost.shape[0] > 0:
            c = _ghost_cell(ghost, keys[i])
            if ghost[c, 0] == _ghost_tag(keys[i]):
                ghost[c, 0] = np.uint64(0)
                ghost[c, 1] = np.uint64(0)
        skey[s] = np.uint64(0xFFFFFFFFFFFFFFFF)
        dirty[s] = False
        pins[s] = 0
        freq[s] = 0
        free[st[ST_FREE_TOP]] = s
        st[ST_FREE_TOP] += 1
        n += 1
    return n




@njit(nogil=True, cache=True, _nrt=False)
def unpin(st, pins, freq, where, stamp, prev, nxt, bkt, bhead, btail, mkeys, mvals, keys):
    """Drop one pin of each distinct key; a row reaching zero pins goes to the LRU's recent end.
    Returns the number of distinct keys that were not pinned (or not cached)."""
    st[ST_CALL] += 1
    call = st[ST_CALL]
    n_bad = 0
    _prefetch_map(mkeys, mvals, keys)
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        if s < 0:
            n_bad += 1
            continue
        if stamp[s] == call:
            continue
        stamp[s] = call
        if pins[s] == 0:
            n_bad += 1
            continue
        pins[s] -= 1
        if pins[s] == 0:
            st[ST_N_PINNED] -= 1
            where[s] = W_FREE
            _place_lru(st, where, freq, prev, nxt, bkt, bhead, btail, s)
    return n_bad




@njit(nogil=True, cache=True, inline="always")
def _prefetch_taken(rows, pins, ghost, keys, slots, i):
    """Prefetch what :func:`take` reads of ``keys[i]``: its row and pin count when cached (``slots[i]``),
    else its ghost cell."""
    s = slots[i]
    if s >= 0:
        prefetch(rows, s)
        prefetch(pins, s)
    elif ghost.shape[0] > 0:
        prefetch(ghost, _ghost_cell(ghost, keys[i]))


@njit(nogil=True, cache=True, _nrt=False)
def take(st, skey, rows, dirty, pins, freq, where, prev, nxt, bkt, bhead, btail, free, mkeys, mvals, ghost,
         keys, slots, out_rows, at, hit):
    """Move rows out to another tier: for each of the distinct ``keys`` (n,) uint64 that is cached,
    copy its row into ``out_rows[at[i]]`` ((m, W); ``at`` (n,) int64) and set ``hit[i]``; an unpinned one then leaves the
    cache (its slot freed, its frequency + 1 remembered in the ghost table, as on an eviction), a
    pinned one stays (frequency += 1). A key not cached gets 1 added to its ghost frequency (a
    ghost cell holding another key is taken over), so the access counts when the key comes back
    with ``put``. ``slots`` (n,) int64: each key's slot, -1 when not cached (``_map_kernels.find``,
    with nothing changed in between: taking a key frees only its own slot, so the others' stay
    valid); the rows, pin counts and ghost cells are prefetched ``prefetch_ahead()`` keys ahead.
    Returns the number of hits."""
    n_hit = 0
    n, ahead = keys.shape[0], prefetch_ahead()
    for i in range(min(ahead, n)):
        _prefetch_taken(rows, pins, ghost, keys, slots, i)
    for i in range(n):
        if i + ahead < n:
            _prefetch_taken(rows, pins, ghost, keys, slots, i + ahead)
        key = keys[i]
        s = slots[i]
        if s < 0:
            hit[i] = False
            if ghost.shape[0] > 0:
                c = _ghost_cell(ghost, key)
                f = np.uint64(1)
                if ghost[c, 0] == _ghost_tag(key):
                    f += ghost[c, 1]
                ghost[c, 0] = _ghost_tag(key)
                ghost[c, 1] = f
            continue
        hit[i] = True
        n_hit += 1
        r = at[i]
        for j in range(rows.shape[1]):
            out_rows[r, j] = rows[s, j]
        freq[s] += 1
        if pins[s] > 0:
            continue
        _detach(st, where, prev, nxt, bkt, bhead, btail, s)
        _release(st, dirty, freq, free, mkeys, mvals, ghost, s, key)
    return n_hit


@njit(nogil=True, cache=True)
def dirty_slots(dirty, where):
    """Slots (m,) int64 of dirty cached rows, in slot order."""
    n = 0
    for s in range(dirty.shape[0]):
        if dirty[s] and where[s] != W_FREE:
            n += 1
    out = np.empty(n, dtype=np.int64)
    n = 0
    for s in range(dirty.shape[0]):
        if dirty[s] and where[s] != W_FREE:
            out[n] = s
            n += 1
    return out
