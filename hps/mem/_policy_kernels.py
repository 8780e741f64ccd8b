"""The replacement policy of the MEM-PS row cache (``hps.mem.RowCache``): its state, its lists and the
device functions that place, visit and evict rows (the only writers of the lists and of ``where``).
Device functions and the state's constants only; the operations that use them are in
``_cache_kernels``, the key -> slot map and ghost cells in ``_map_kernels``.

State layout (all arrays owned by the host class, passed in as arguments; C = capacity in rows; the
per-slot ones but ``rows`` and ``free`` are the fields of one record a slot, ``_slots.SLOT_RECORD``,
each passed as a strided array):

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
- Key -> slot map and ghost table: see ``_map_kernels``.

Pinned rows are in no list: pinning detaches a row, unpinning to zero puts it at the LRU's recent
end. Every insertion into the LRU part demotes its least recent row into the LFU part while the LRU
part holds more than ``st[ST_LRU_TARGET]`` rows. A victim is the LFU minimum, else the LRU tail. A row whose
frequency grows while it sits in the LFU part (a key repeated within one ``put``) re-enters it.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit
from ._map_kernels import _ghost_cell, _ghost_tag, _map_del

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
        ghost[c, 0] = _ghost_tag(key)
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
