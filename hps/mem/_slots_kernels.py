"""Kernels that resize the state of a ``RowCache`` (``hps.mem._slots.CacheSlots``). Kernels only.

The layout is the one of ``_policy_kernels`` and ``_map_kernels`` (read their docstrings). A resize keeps every cached row,
its list position, pins, frequency and dirty flag; the key map is rebuilt from ``skey`` (a map's
layout carries no policy state) and the ghost table keeps every remembered key that still has a
cell of its own.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit
from ._map_kernels import _ghost_cell, _ghost_tag, _map_put
from ._policy_kernels import ST_FREE_TOP, W_FREE, W_LFU, W_LRU


@njit(nogil=True, cache=True, _nrt=False)
def free_slots_from(skey, prev, nxt, start):
    """Lay out slots ``start`` and up as free (no key, in no list; their other fields zero already): one
    pass over their records (three NumPy fills of the strided fields made three)."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    for s in range(start, skey.shape[0]):
        skey[s] = empty
        prev[s] = -1
        nxt[s] = -1


@njit(nogil=True, cache=True, _nrt=False)
def rebuild_map(skey, where, mkeys, mvals):
    """Empty the map ``mkeys``/``mvals`` (M,) and insert the key of every cached slot (``where`` not
    ``W_FREE``). REQUIRES: M a power of two above the number of cached slots."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    for i in range(mkeys.shape[0]):
        mkeys[i] = empty
        mvals[i] = 0
    for s in range(skey.shape[0]):
        if where[s] != W_FREE:
            _map_put(mkeys, mvals, skey[s], s)


@njit(nogil=True, cache=True, _nrt=False)
def spread_ghost(ghost, old_cells):
    """The ghost table grew from ``old_cells`` to ``ghost.shape[0]`` cells (both powers of two; the new
    cells empty: zeros): move each remembered key to its cell in the larger table. Its new cell is its
    old one plus a multiple of ``old_cells``, which only it can claim: nothing is forgotten."""
    for c in range(old_cells):
        tag = ghost[c, 0]
        if tag == np.uint64(0):
            continue
        t = _ghost_cell(ghost, _ghost_tag(tag))   # the tag of a tag is the key
        if t != np.uint64(c):
            ghost[t, 0] = tag
            ghost[t, 1] = ghost[c, 1]
            ghost[c, 0] = np.uint64(0)
            ghost[c, 1] = np.uint64(0)


@njit(nogil=True, cache=True, _nrt=False)
def fold_ghost(ghost, new_cells):
    """The ghost table is to shrink to its first ``new_cells`` cells (a power of two): a key of a cell
    past them moves to its cell in the smaller table (its cell modulo ``new_cells``) when that one is
    empty, else it is forgotten (a direct-mapped table keeps one key per cell). Empty cells are zeros."""
    for c in range(new_cells, ghost.shape[0]):
        tag = ghost[c, 0]
        if tag == np.uint64(0):
            continue
        t = c & (new_cells - 1)
        if ghost[t, 0] == np.uint64(0):
            ghost[t, 0] = tag
            ghost[t, 1] = ghost[c, 1]


@njit(nogil=True, cache=True, _nrt=False)
def compact(st, skey, rows, dirty, pins, freq, where, stamp, prev, nxt, bkt, bhead, btail, free, n_slots):
    """Move every cached row of a slot at or past ``n_slots`` into a free slot below it (its key, row,
    flags, frequency, pins and list position go along), then rebuild the free stack from the free
    slots below ``n_slots``, the lowest on top. The key map is stale afterwards: rebuild it.
    REQUIRES: at most ``n_slots`` rows cached. Returns the number of rows moved."""
    t = 0
    moved = 0
    for s in range(n_slots, skey.shape[0]):
        w = where[s]
        if w == W_FREE:
            continue
        while where[t] != W_FREE:
            t += 1
        skey[t] = skey[s]
        for j in range(rows.shape[1]):
            rows[t, j] = rows[s, j]
        dirty[t] = dirty[s]
        pins[t] = pins[s]
        freq[t] = freq[s]
        stamp[t] = stamp[s]
        where[t] = w
        b = bkt[s]
        bkt[t] = b
        if w == W_LRU or w == W_LFU:
            p = prev[s]
            q = nxt[s]
            prev[t] = p
            nxt[t] = q
            if p >= 0:
                nxt[p] = t
            else:
                bhead[b] = t
            if q >= 0:
                prev[q] = t
            else:
                btail[b] = t
        else:
            prev[t] = -1
            nxt[t] = -1
        where[s] = W_FREE
        prev[s] = -1
        nxt[s] = -1
        t += 1
        moved += 1
    top = 0
    for s in range(n_slots - 1, -1, -1):
        if where[s] == W_FREE:
            free[top] = s
            top += 1
    st[ST_FREE_TOP] = top
    return moved



@njit(nogil=True, cache=True, _nrt=False)
def dirty_slots_from(dirty, where, start, out):
    """Write into ``out`` (m,) int64 the first m slots at or past ``start`` holding a dirty row (in
    slot order) -> how many were found."""
    n = 0
    for s in range(start, dirty.shape[0]):
        if n == out.shape[0]:
            break
        if dirty[s] and where[s] != W_FREE:
            out[n] = s
            n += 1
    return n
