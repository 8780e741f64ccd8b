"""The state of the MEM-PS row cache (``hps.mem.RowCache``) and the device functions that keep it: the
key -> slot map, the LRU and LFU lists, eviction. Device functions and constants only; the operation
kernels built on them are in ``_cache_kernels``.

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
  EXACT_FREQS, then one class per power of two, the last one open-ended (``bucket``). A row enters
  the tail of its class's list; the victim is the head of the lowest non-empty class:
  least frequent first, and among equals the one that entered the LFU part first. Every LFU
  operation is O(1) (``st[ST_LFU_MIN]`` remembers a lower bound of the lowest non-empty class).
- ``free`` (C,) int32: stack of free slots (``st[ST_FREE_TOP]`` of them).
- Key -> slot map: linear probing ``mkeys`` (M,) uint64 / ``mvals`` (M,) int32, M a power of two
  >= 2 C, ``EMPTY`` = all ones; deletion by backward shift (no tombstones).
- Ghost history (optional; G = ``ghost.shape[0]`` is 0 or a power of two): a direct-mapped table
  ``ghost`` (G, 2) uint64 of (evicted key, its frequency) -- one cache line per probe -- cell
  ``mix64(key ^ 0x2545F4914F6CDD1D) & (G - 1)`` (``ghost_cell``: a salt of its own, written as a
  literal since kernels read no module globals); an eviction overwrites its cell; a key re-inserted while
  remembered starts from its remembered frequency (and frees the cell).

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
def map_get(mkeys, mvals, key):
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
def map_put(mkeys, mvals, key, val):
    """REQUIRES: key absent, map not full."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    mask = np.uint64(mkeys.shape[0] - 1)
    i = mix64(key) & mask
    while mkeys[i] != empty:
        i = (i + np.uint64(1)) & mask
    mkeys[i] = key
    mvals[i] = val


@njit(nogil=True, cache=True, inline="always")
def map_del(mkeys, mvals, key):
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
def ghost_cell(ghost, key):
    """Ghost cell of ``key``: an independent hash (salt 0x2545F4914F6CDD1D) of a power-of-two table."""
    return mix64(key ^ np.uint64(0x2545F4914F6CDD1D)) & np.uint64(ghost.shape[0] - 1)


@njit(nogil=True, cache=True, inline="always")
def prefetch_map(mkeys, mvals, keys):
    """Prefetch the home map cell (key and value) of every key (see ``hps/_prefetch.py``)."""
    mask = np.uint64(mkeys.shape[0] - 1)
    for i in range(keys.shape[0]):
        h = mix64(keys[i]) & mask
        prefetch(mkeys, h)
        prefetch(mvals, h)


# ---------------------------------------------------------------- LFU part: FIFO lists by frequency class

@njit(nogil=True, cache=True, inline="always")
def bucket(f):
    """Frequency class of ``f`` (see the module docstring)."""
    if f < EXACT_FREQS:
        return np.int64(0) if f < 0 else np.int64(f)
    b = np.int64(EXACT_FREQS - 6)   # f >= 64 = 2**6: class EXACT_FREQS + floor(log2 f) - 6
    while f > 1:
        f >>= 1
        b += 1
    return min(b, np.int64(N_BUCKETS - 1))


@njit(nogil=True, cache=True, inline="always")
def append(st, prev, nxt, bkt, bhead, btail, b, s):
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
def unlink(st, prev, nxt, bkt, bhead, btail, s):
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
def lfu_push(st, freq, prev, nxt, bkt, bhead, btail, s):
    """Append detached slot ``s`` to the list of its frequency class."""
    b = bucket(freq[s])
    append(st, prev, nxt, bkt, bhead, btail, b, s)
    if b < st[ST_LFU_MIN]:
        st[ST_LFU_MIN] = b


@njit(nogil=True, cache=True, inline="always")
def lfu_min(st, bhead):
    """The LFU victim (head of the lowest non-empty class). REQUIRES: the LFU part is not empty."""
    b = st[ST_LFU_MIN]
    while bhead[b] < 0:
        b += 1
    st[ST_LFU_MIN] = b
    return bhead[b]


@njit(nogil=True, cache=True, inline="always")
def resift(st, where, freq, prev, nxt, bkt, bhead, btail, s):
    """The frequency of slot ``s`` grew: if it sits in the LFU part, it re-enters at its class's tail."""
    if where[s] == W_LFU:
        unlink(st, prev, nxt, bkt, bhead, btail, s)
        lfu_push(st, freq, prev, nxt, bkt, bhead, btail, s)


# ---------------------------------------------------------------- placement

@njit(nogil=True, cache=True, inline="always")
def detach(st, where, prev, nxt, bkt, bhead, btail, s):
    if where[s] == W_LRU or where[s] == W_LFU:
        unlink(st, prev, nxt, bkt, bhead, btail, s)
    where[s] = W_FREE


@njit(nogil=True, cache=True, inline="always")
def place_lru(st, where, freq, prev, nxt, bkt, bhead, btail, s):
    """Put detached slot ``s`` at the LRU's recent end, then demote the least recent LRU rows into
    the LFU part while the LRU part is over its target."""
    append(st, prev, nxt, bkt, bhead, btail, LRU_LIST, s)
    where[s] = W_LRU
    while st[ST_LRU_SIZE] > st[ST_LRU_TARGET]:
        t = bhead[LRU_LIST]
        unlink(st, prev, nxt, bkt, bhead, btail, t)
        where[t] = W_LFU
        lfu_push(st, freq, prev, nxt, bkt, bhead, btail, t)


@njit(nogil=True, cache=True, inline="always")
def release(st, dirty, freq, free, mkeys, mvals, ghost, s, key):
    """Slot ``s`` of ``key``, already detached, leaves the cache: the key leaves the map, its
    frequency goes to the ghost table, the slot goes on the free stack."""
    map_del(mkeys, mvals, key)
    if ghost.shape[0] > 0:
        c = ghost_cell(ghost, key)
        ghost[c, 0] = key
        ghost[c, 1] = np.uint64(freq[s])
    dirty[s] = False
    free[st[ST_FREE_TOP]] = s
    st[ST_FREE_TOP] += 1


@njit(nogil=True, cache=True, inline="always")
def evict_one(st, skey, rows, dirty, freq, where, prev, nxt, bkt, bhead, btail, free,
               mkeys, mvals, ghost, ev_keys, ev_rows, ev_dirty, ev_freq, n_ev):
    """Evict the LFU minimum (else the LRU tail) into ``ev_*[n_ev]``; its slot goes on the free stack.
    Returns False when every cached row is pinned."""
    if st[ST_LFU_SIZE] > 0:
        s = lfu_min(st, bhead)
    elif st[ST_LRU_SIZE] > 0:
        s = bhead[LRU_LIST]
    else:
        return False
    unlink(st, prev, nxt, bkt, bhead, btail, s)
    key = skey[s]
    ev_keys[n_ev] = key
    for j in range(rows.shape[1]):
        ev_rows[n_ev, j] = rows[s, j]
    ev_dirty[n_ev] = dirty[s]
    ev_freq[n_ev] = freq[s]
    where[s] = W_FREE
    release(st, dirty, freq, free, mkeys, mvals, ghost, s, key)
    return True


@njit(nogil=True, cache=True, inline="always")
def visit(st, where, freq, prev, nxt, bkt, bhead, btail, pins, s, pin):
    """A cached row was accessed: pin it (out of both parts), or move it to the LRU's recent end."""
    if pin:
        if pins[s] == 0:
            detach(st, where, prev, nxt, bkt, bhead, btail, s)
            where[s] = W_PINNED
            st[ST_N_PINNED] += 1
        pins[s] += 1
    elif where[s] != W_PINNED:
        detach(st, where, prev, nxt, bkt, bhead, btail, s)
        place_lru(st, where, freq, prev, nxt, bkt, bhead, btail, s)
