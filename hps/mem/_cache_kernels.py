"""Kernels of the MEM-PS row cache (``hps.mem.RowCache``). Kernels and device functions only.

State layout (all arrays owned by the host class, passed in as arguments; C = capacity in rows):

- ``st`` (N_STATE,) int64: scalars, indexed by the ``ST_*`` constants below.
- ``skey`` (C,) uint64: key of each slot; ``rows`` (C, W): the row; ``dirty`` (C,) bool.
- ``pins`` (C,) int32: pin count; ``freq`` (C,) int64: accesses counted while cached (+ ghost);
  ``where`` (C,) int8: ``W_FREE`` / ``W_LRU`` / ``W_LFU`` / ``W_PINNED``;
  ``stamp`` (C,) int64: id of the last call that touched the slot (once-per-call logic).
- Lists: ``prev``/``nxt`` (C,) int32 link rows into doubly linked lists (-1 = nil) whose ends are
  ``bhead``/``btail`` (N_BUCKETS + 1,) int32; ``bkt`` (C,) int32 is the list a row is in. A row is
  in at most one list. Every list is FIFO: rows are appended at the tail and leave from the head.
- LRU part: list LRU_LIST, least recent at the head.
- LFU part: lists 0 .. N_BUCKETS - 1, one per frequency class. Class of a frequency f: f itself below
  EXACT_FREQS, then one class per power of two, the last one open-ended (``_bucket``). A row enters
  the tail of its class's list; the victim is the head of the lowest non-empty class:
  least frequent first, and among equals the one that entered the LFU part first. Every LFU
  operation is O(1) (``st[ST_LFU_MIN]`` remembers a lower bound of the lowest non-empty class).
- ``free`` (C,) int32: stack of free slots (``st[ST_FREE_TOP]`` of them).
- Key -> slot map: linear probing ``mkeys`` (M,) uint64 / ``mvals`` (M,) int32, M a power of two
  >= 2 C, ``EMPTY`` = all ones; deletion by backward shift (no tombstones).
- Ghost history (optional; G = ``ghost.shape[0]`` is 0 or a power of two): a direct-mapped table
  ``ghost`` (G, 2) uint64 of (evicted key, its frequency) -- one cache line per probe -- cell
  ``mix64(key ^ 0x2545F4914F6CDD1D) & (G - 1)`` (``_ghost_cell``: a salt of its own, written as a
  literal since kernels read no module globals); an eviction overwrites its cell; a key re-inserted while
  remembered starts from its remembered frequency (and frees the cell).

Performance note: the operation kernels that allocate nothing are compiled with ``_nrt=False``.
With Numba's reference counting on, the array arguments of the inlined helpers get atomic
incref/decref pairs inside the per-key loop that the refcount pruner does not remove; measured on
3,000 keys: 970 us with NRT, 86 us without (11x). Helpers are ``inline="always"`` for the same reason.
The operation kernels start with a pass of ``prefetch`` hints over the batch (map cells; ghost cells
in ``put``): a per-key body is a chain of dependent loads, so without them a cache miss stalls one
key at a time. Measured on the replay (alpha 0.8, 10 % cache): ``put`` 581 -> 370 us a batch,
``lookup`` 247 -> 175, ``unpin`` 224 -> 165 (with the heap the LFU part was then). Kernels do no
bounds checks: the host sizes every array (see each kernel's REQUIRES). Kernels are not thread-safe;
the host serialises calls on one state.

Pinned rows are in no list: pinning detaches a row, unpinning to zero puts it at the LRU's recent
end. Every insertion into the LRU part demotes its least recent row into the LFU part while the LRU
part holds more than ``st[ST_LRU_TARGET]`` rows. A victim is the LFU minimum, else the LRU tail. A row whose
frequency grows while it sits in the LFU part (a key repeated within one ``put``) re-enters it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._hashing import mix64
from .._prefetch import prefetch

# Indices into ``st``.
ST_LRU_SIZE = 0
ST_LFU_SIZE = 1
ST_N_PINNED = 2
ST_LFU_MIN = 3
ST_LRU_TARGET = 4
ST_FREE_TOP = 5
ST_CALL = 6
N_STATE = 7

#: Frequencies below this are told apart exactly by the LFU order; above, by powers of two.
EXACT_FREQS = 64
#: LFU frequency classes: 0 .. EXACT_FREQS - 1, then [2**k, 2**(k+1)) for k = 6 .. 22, then >= 2**23.
N_BUCKETS = EXACT_FREQS + 18
#: The list of the LRU part (after the LFU classes in ``bhead``/``btail``).
LRU_LIST = N_BUCKETS

# Values of ``where``.
W_FREE = 0
W_LRU = 1
W_LFU = 2
W_PINNED = 3


# ---------------------------------------------------------------- key -> int32 map (linear probing)

@njit(nogil=True, cache=True, inline="always")
def _map_get(mkeys, mvals, key):
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    mask = np.uint64(mkeys.shape[0] - 1)
    i = mix64(key) & mask
    while True:
        k = mkeys[i]
        if k == key:
            return np.int64(mvals[i])
        if k == empty:
            return np.int64(-1)
        i = (i + np.uint64(1)) & mask


@njit(nogil=True, cache=True, inline="always")
def _map_put(mkeys, mvals, key, val):
    """REQUIRES: key absent, map not full."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    mask = np.uint64(mkeys.shape[0] - 1)
    i = mix64(key) & mask
    while mkeys[i] != empty:
        i = (i + np.uint64(1)) & mask
    mkeys[i] = key
    mvals[i] = val


@njit(nogil=True, cache=True, inline="always")
def _map_del(mkeys, mvals, key):
    """Remove ``key`` (no-op when absent) by backward-shift deletion."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    mask = np.uint64(mkeys.shape[0] - 1)
    i = mix64(key) & mask
    while True:
        k = mkeys[i]
        if k == key:
            break
        if k == empty:
            return
        i = (i + np.uint64(1)) & mask
    j = i
    while True:
        j = (j + np.uint64(1)) & mask
        k = mkeys[j]
        if k == empty:
            break
        h = mix64(k) & mask
        # The entry at j may move back to i unless its home h lies cyclically in (i, j].
        if i <= j:
            stays = i < h <= j
        else:
            stays = h > i or h <= j
        if not stays:
            mkeys[i] = k
            mvals[i] = mvals[j]
            i = j
    mkeys[i] = empty


@njit(nogil=True, cache=True, inline="always")
def _ghost_cell(ghost, key):
    """Ghost cell of ``key``: an independent hash (salt 0x2545F4914F6CDD1D) of a power-of-two table."""
    return mix64(key ^ np.uint64(0x2545F4914F6CDD1D)) & np.uint64(ghost.shape[0] - 1)


@njit(nogil=True, cache=True, inline="always")
def _prefetch_map(mkeys, mvals, keys):
    """Prefetch the home map cell (key and value) of every key (see ``hps/_prefetch.py``)."""
    mask = np.uint64(mkeys.shape[0] - 1)
    for i in range(keys.shape[0]):
        h = mix64(keys[i]) & mask
        prefetch(mkeys, h)
        prefetch(mvals, h)


# ---------------------------------------------------------------- LFU part: FIFO lists by frequency class

@njit(nogil=True, cache=True, inline="always")
def _bucket(f):
    """Frequency class of ``f`` (see the module docstring)."""
    if f < EXACT_FREQS:
        return np.int64(0) if f < 0 else np.int64(f)
    b = np.int64(EXACT_FREQS - 6)   # f >= 64 = 2**6: class EXACT_FREQS + floor(log2 f) - 6
    while f > 1:
        f >>= 1
        b += 1
    return min(b, np.int64(N_BUCKETS - 1))


@njit(nogil=True, cache=True, inline="always")
def _append(st, prev, nxt, bkt, bhead, btail, b, s):
    """Append detached slot ``s`` to the tail of list ``b``."""
    t = btail[b]
    prev[s] = t
    nxt[s] = -1
    if t >= 0:
        nxt[t] = s
    else:
        bhead[b] = s
    btail[b] = s
    bkt[s] = b
    st[ST_LRU_SIZE if b == LRU_LIST else ST_LFU_SIZE] += 1


@njit(nogil=True, cache=True, inline="always")
def _unlink(st, prev, nxt, bkt, bhead, btail, s):
    """Take slot ``s`` out of its list."""
    b = bkt[s]
    p = prev[s]
    q = nxt[s]
    if p >= 0:
        nxt[p] = q
    else:
        bhead[b] = q
    if q >= 0:
        prev[q] = p
    else:
        btail[b] = p
    prev[s] = -1
    nxt[s] = -1
    st[ST_LRU_SIZE if b == LRU_LIST else ST_LFU_SIZE] -= 1


@njit(nogil=True, cache=True, inline="always")
def _lfu_push(st, freq, prev, nxt, bkt, bhead, btail, s):
    """Append detached slot ``s`` to the list of its frequency class."""
    b = _bucket(freq[s])
    _append(st, prev, nxt, bkt, bhead, btail, b, s)
    if b < st[ST_LFU_MIN]:
        st[ST_LFU_MIN] = b


@njit(nogil=True, cache=True, inline="always")
def _lfu_min(st, bhead):
    """The LFU victim (head of the lowest non-empty class). REQUIRES: the LFU part is not empty."""
    b = st[ST_LFU_MIN]
    while bhead[b] < 0:
        b += 1
    st[ST_LFU_MIN] = b
    return bhead[b]


@njit(nogil=True, cache=True, inline="always")
def _resift(st, where, freq, prev, nxt, bkt, bhead, btail, s):
    """The frequency of slot ``s`` grew: if it sits in the LFU part, it re-enters at its class's tail."""
    if where[s] == W_LFU:
        _unlink(st, prev, nxt, bkt, bhead, btail, s)
        _lfu_push(st, freq, prev, nxt, bkt, bhead, btail, s)


# ---------------------------------------------------------------- placement

@njit(nogil=True, cache=True, inline="always")
def _detach(st, where, prev, nxt, bkt, bhead, btail, s):
    if where[s] == W_LRU or where[s] == W_LFU:
        _unlink(st, prev, nxt, bkt, bhead, btail, s)
    where[s] = W_FREE


@njit(nogil=True, cache=True, inline="always")
def _place_lru(st, where, freq, prev, nxt, bkt, bhead, btail, s):
    """Put detached slot ``s`` at the LRU's recent end, then demote the least recent LRU rows into
    the LFU part while the LRU part is over its target."""
    _append(st, prev, nxt, bkt, bhead, btail, LRU_LIST, s)
    where[s] = W_LRU
    while st[ST_LRU_SIZE] > st[ST_LRU_TARGET]:
        t = bhead[LRU_LIST]
        _unlink(st, prev, nxt, bkt, bhead, btail, t)
        where[t] = W_LFU
        _lfu_push(st, freq, prev, nxt, bkt, bhead, btail, t)


@njit(nogil=True, cache=True, inline="always")
def _release(st, dirty, freq, free, mkeys, mvals, ghost, s, key):
    """Slot ``s`` of ``key``, already detached, leaves the cache: the key leaves the map, its
    frequency goes to the ghost table, the slot goes on the free stack."""
    _map_del(mkeys, mvals, key)
    if ghost.shape[0] > 0:
        c = _ghost_cell(ghost, key)
        ghost[c, 0] = key
        ghost[c, 1] = np.uint64(freq[s])
    dirty[s] = False
    free[st[ST_FREE_TOP]] = s
    st[ST_FREE_TOP] += 1


@njit(nogil=True, cache=True, inline="always")
def _evict_one(st, skey, rows, dirty, freq, where, prev, nxt, bkt, bhead, btail, free,
               mkeys, mvals, ghost, ev_keys, ev_rows, ev_dirty, ev_freq, n_ev):
    """Evict the LFU minimum (else the LRU tail) into ``ev_*[n_ev]``; its slot goes on the free stack.
    Returns False when every cached row is pinned."""
    if st[ST_LFU_SIZE] > 0:
        s = _lfu_min(st, bhead)
    elif st[ST_LRU_SIZE] > 0:
        s = bhead[LRU_LIST]
    else:
        return False
    _unlink(st, prev, nxt, bkt, bhead, btail, s)
    key = skey[s]
    ev_keys[n_ev] = key
    for j in range(rows.shape[1]):
        ev_rows[n_ev, j] = rows[s, j]
    ev_dirty[n_ev] = dirty[s]
    ev_freq[n_ev] = freq[s]
    where[s] = W_FREE
    _release(st, dirty, freq, free, mkeys, mvals, ghost, s, key)
    return True


@njit(nogil=True, cache=True, inline="always")
def _visit(st, where, freq, prev, nxt, bkt, bhead, btail, pins, s, pin):
    """A cached row was accessed: pin it (out of both parts), or move it to the LRU's recent end."""
    if pin:
        if pins[s] == 0:
            _detach(st, where, prev, nxt, bkt, bhead, btail, s)
            where[s] = W_PINNED
            st[ST_N_PINNED] += 1
        pins[s] += 1
    elif where[s] != W_PINNED:
        _detach(st, where, prev, nxt, bkt, bhead, btail, s)
        _place_lru(st, where, freq, prev, nxt, bkt, bhead, btail, s)


# ---------------------------------------------------------------- operations (one per host method)

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


@njit(nogil=True, cache=True, _nrt=False)
def put(st, skey, rows, dirty, pins, freq, where, stamp, prev, nxt, bkt, bhead, btail, free, mkeys, mvals,
        ghost, keys, in_rows, in_dirty, in_freq, pin,
        ev_keys, ev_rows, ev_dirty, ev_freq):
    """Insert or assign rows; evicts into ``ev_*`` as needed. REQUIRES: ``put_check`` passed.
    keys (n,) uint64, in_rows (n, W), in_dirty (n,) bool, in_freq (n,) int64; ``ev_*`` have room for
    n rows (not only the new keys: without pins a call may evict its own keys and re-insert them).
    Returns the number of evicted rows."""
    st[ST_CALL] += 1
    call = st[ST_CALL]
    n_ev = 0
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    _prefetch_map(mkeys, mvals, keys)
    if ghost.shape[0] > 0:
        for i in range(keys.shape[0]):
            prefetch(ghost, _ghost_cell(ghost, keys[i]))
    for i in range(keys.shape[0]):
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
                if ghost[c, 0] == key:
                    f += np.int64(ghost[c, 1])
                    ghost[c, 0] = empty
            freq[s] = f
            dirty[s] = in_dirty[i]
            pins[s] = 0
            where[s] = W_FREE
            stamp[s] = 0
        else:
            freq[s] += in_freq[i]
            dirty[s] = dirty[s] or in_dirty[i]
        for j in range(rows.shape[1]):
            rows[s, j] = in_rows[i, j]
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
            if ghost[c, 0] == keys[i]:
                ghost[c, 0] = np.uint64(0xFFFFFFFFFFFFFFFF)
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
def update(rows, dirty, mkeys, mvals, keys, in_rows, found):
    """Assign rows of cached keys and mark them dirty; no access is counted. found (n,) bool written.
    Returns the number of keys found."""
    n = 0
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        found[i] = s >= 0
        if s < 0:
            continue
        n += 1
        dirty[s] = True
        for j in range(rows.shape[1]):
            rows[s, j] = in_rows[i, j]
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


@njit(nogil=True, cache=True, _nrt=False)
def contains(mkeys, mvals, keys, found):
    """found[i] = keys[i] is cached. keys (n,) uint64, found (n,) bool (written)."""
    _prefetch_map(mkeys, mvals, keys)
    for i in range(keys.shape[0]):
        found[i] = _map_get(mkeys, mvals, keys[i]) >= 0


@njit(nogil=True, cache=True, _nrt=False)
def take(st, skey, rows, dirty, pins, freq, where, prev, nxt, bkt, bhead, btail, free, mkeys, mvals, ghost,
         keys, out_rows, hit):
    """Move rows out to another tier: for each of the distinct ``keys`` (n,) uint64 that is cached,
    copy its row into ``out_rows[i]`` (n, W) and set ``hit[i]``; an unpinned one then leaves the
    cache (its slot freed, its frequency + 1 remembered in the ghost table, as on an eviction), a
    pinned one stays (frequency += 1). A key not cached gets 1 added to its ghost frequency (a
    ghost cell holding another key is taken over), so the access counts when the key comes back
    with ``put``. Returns the number of hits."""
    n_hit = 0
    _prefetch_map(mkeys, mvals, keys)
    for i in range(keys.shape[0]):
        key = keys[i]
        s = _map_get(mkeys, mvals, key)
        if s < 0:
            hit[i] = False
            if ghost.shape[0] > 0:
                c = _ghost_cell(ghost, key)
                f = np.uint64(1)
                if ghost[c, 0] == key:
                    f += ghost[c, 1]
                ghost[c, 0] = key
                ghost[c, 1] = f
            continue
        hit[i] = True
        n_hit += 1
        for j in range(rows.shape[1]):
            out_rows[i, j] = rows[s, j]
        freq[s] += 1
        if pins[s] > 0:
            continue
        _detach(st, where, prev, nxt, bkt, bhead, btail, s)
        _release(st, dirty, freq, free, mkeys, mvals, ghost, s, key)
    return n_hit


@njit(nogil=True, cache=True, _nrt=False)
def gather(rows, mkeys, mvals, keys, out_rows, found):
    """Copy rows of cached keys without counting an access. found (n,) bool written."""
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        found[i] = s >= 0
        if s >= 0:
            for j in range(rows.shape[1]):
                out_rows[i, j] = rows[s, j]


@njit(nogil=True, cache=True, _nrt=False)
def pin_counts(pins, mkeys, mvals, keys, out):
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        out[i] = pins[s] if s >= 0 else 0


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


@njit(nogil=True, cache=True, _nrt=False)
def mark_clean(dirty, mkeys, mvals, keys):
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        if s >= 0:
            dirty[s] = False


@njit(nogil=True, cache=True)
def unique_counts(keys):
    """Distinct keys in first-occurrence order with their counts and the inverse map.
    keys (n,) uint64 -> uniq (u,) uint64, counts (u,) int64, inverse (n,) int64."""
    n = keys.shape[0]
    m = 16
    while m < 2 * n:
        m *= 2
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    tkeys = np.full(m, empty, dtype=np.uint64)
    tvals = np.empty(m, dtype=np.int64)
    mask = np.uint64(m - 1)
    uniq = np.empty(n, dtype=np.uint64)
    counts = np.zeros(n, dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    u = 0
    for i in range(n):
        key = keys[i]
        h = mix64(key) & mask
        while True:
            k = tkeys[h]
            if k == key:
                v = tvals[h]
                break
            if k == empty:
                tkeys[h] = key
                tvals[h] = u
                uniq[u] = key
                v = u
                u += 1
                break
            h = (h + np.uint64(1)) & mask
        counts[v] += 1
        inverse[i] = v
    return uniq[:u], counts[:u], inverse
