"""``CacheSlots``: the arrays of a ``RowCache``, sized to the rows it holds, not to its capacity.

A cache of a large budget starts with ``INITIAL_SLOTS`` slots and doubles its arrays as rows
arrive, up to the capacity (amortised O(1) per row); a lowered capacity shrinks them. Memory
follows the data: a 4 GiB budget over 10 k rows holds about 10 k rows' worth of arrays. The
kernels see arrays of the current size (layout: ``_policy_kernels``; the per-slot state is one
record a slot, ``SLOT_RECORD``, its fields strided arrays) and never resize.

Growth and shrinking resize each array in place (a view of address space reserved up to the cache's
capacity, ``_reserve.Reserved``: growing copies nothing, so the old and the new array are never both in
memory, and pages are faulted in only as rows are written; shrinking gives the pages back) and
then restore the invariants of the layout: free slots on the stack in the order a cache allocated
at full size would hand them out (so growth changes no decision: the same rows go to the same
slots), the key map a power of two at least twice the slots, the ghost table
``ghost_factor`` x slots cells rounded up to a power of two (at least 16; 0 without ghosts),
keeping the keys it remembers (``_slots_kernels``).

REQUIRES: nobody holds a view of these arrays across a resize (the cache hands out copies only).
Not thread-safe: the owning cache's lock serialises every call.
"""

from __future__ import annotations

import numpy as np

from ..errors import CacheBudgetError
from . import _cache_kernels as K
from . import _policy_kernels as P
from . import _slots_kernels as SK
from ._reserve import Reserved

#: ``at`` of the kernels that read rows ``in_rows[at[i]]`` when the rows are in order (``in_rows[i]``)
NO_AT = np.empty(0, dtype=np.int64)
#: Slots a cache allocates at first (fewer when its capacity is smaller); it doubles from there.
INITIAL_SLOTS = 4096
#: The per-slot state besides the row (names as in ``_policy_kernels``), one record a slot: a kernel's
#: visit of a slot reads and writes several of them (its key, frequency, stamp, list links, pins...),
#: and as fields of one 48-byte record they share one or two cache lines where arrays of their own
#: cost a line each (the kernels take each field as a strided view: their code is unchanged).
#: ``python -m bench.memps_churn``, 6 interleaved pairs against separate arrays (2-core VM, 2026-11-28):
#: push 572-723 ns a row against 762-893 (0.68-0.83x), take within the spread. A 64-byte record (one line
#: each) and the key map as (key, slot) records of 16 bytes measured no better; not kept. NumPy flags a
#: field view of one slot contiguous, so a cache shrunk to one slot (a budget all but spent) compiles its
#: kernels once more, for contiguous arrays (the same results).
SLOT_RECORD = np.dtype([("skey", np.uint64), ("freq", np.int64), ("stamp", np.int64), ("pins", np.int32),
                        ("prev", np.int32), ("nxt", np.int32), ("bkt", np.int32), ("dirty", np.bool_),
                        ("where", np.int8)], align=True)
_FIELDS = SLOT_RECORD.names
#: What grows with the slots (the records and the rows) and the free stack (int32 slots).
_GROWING = ("meta", "rows", "free")
#: Bytes of per-slot state besides the row: its record and one free-stack entry.
SLOT_STATE_BYTES = SLOT_RECORD.itemsize + 4
#: Bytes of one key-map cell (key u64, slot i32) and of one ghost cell (key, frequency: 2 x u64).
MAP_CELL_BYTES, GHOST_CELL_BYTES = 12, 16


def pow2_at_least(n: int) -> int:
    m = 16
    while m < n:
        m *= 2
    return m


def map_cells(n_slots: int) -> int:
    return pow2_at_least(2 * n_slots)


def ghost_cells(n_slots: int, ghost_factor: float) -> int:
    g = int(round(float(ghost_factor) * n_slots))
    return pow2_at_least(g) if g else 0


def slots_bytes(n_slots: int, row_bytes: int, ghost_factor: float) -> int:
    """DRAM of ``CacheSlots`` with ``n_slots`` slots of ``row_bytes``-byte rows (what ``nbytes`` says)."""
    n = int(n_slots)
    return (n * (int(row_bytes) + SLOT_STATE_BYTES) + MAP_CELL_BYTES * map_cells(n)
            + GHOST_CELL_BYTES * ghost_cells(n, ghost_factor) + 8 * P.N_STATE + 8 * (P.N_BUCKETS + 1))


def rows_for_bytes(n_bytes: int, row_bytes: int, ghost_factor: float) -> int:
    """The most slots whose :func:`slots_bytes` fits in ``n_bytes`` (0 if none)."""
    lo, hi = 0, max(1, int(n_bytes) // max(1, int(row_bytes)))
    while lo < hi:   # slots_bytes grows with the slots: binary search
        mid = (lo + hi + 1) // 2
        if slots_bytes(mid, row_bytes, ghost_factor) <= n_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


class CacheSlots:
    """The state arrays of a cache of ``n`` slots (names as in ``_policy_kernels``) and the launchers of
    the kernels over them; the owning ``RowCache`` validates, locks, counts and decides."""

    def __init__(self, n_slots: int, row_width: int, dtype, ghost_factor: float, limit: int | None = None):
        """``limit``: the most slots it is expected to grow to (its cache's capacity; default ``n_slots``):
        the address space its arrays reserve (``_reserve``), so that growing up to it copies nothing."""
        n = int(n_slots)
        self.n = n
        self.ghost_factor = float(ghost_factor)
        lim = max(n, int(limit or n))
        self.st = np.zeros(P.N_STATE, dtype=np.int64)
        self._res = {"meta": Reserved(lim, SLOT_RECORD), "free": Reserved(lim, np.int32)}
        self._res["rows"] = Reserved(lim, dtype, (int(row_width),))
        self._res["mkeys"] = Reserved(map_cells(lim), np.uint64)
        self._res["mvals"] = Reserved(map_cells(lim), np.int32)
        self._res["ghost"] = Reserved(ghost_cells(lim, ghost_factor), np.uint64, (2,))   # (key's tag, freq) per cell
        for name in _GROWING:
            self._bind(name, self._res[name].view(n))
        SK.free_slots_from(self.skey, self.prev, self.nxt, 0)
        self.bhead = np.full(P.N_BUCKETS + 1, -1, dtype=np.int32)   # the LFU classes, then the LRU part
        self.btail = np.full(P.N_BUCKETS + 1, -1, dtype=np.int32)
        self.mkeys = self._res["mkeys"].view(map_cells(n))
        self.mvals = self._res["mvals"].view(self.mkeys.shape[0])
        self.ghost = self._res["ghost"].view(ghost_cells(n, ghost_factor))   # zeros: empty (``_map_kernels``)
        # the resize kernels lay out the empty state (slot 0 on top of the free stack, an empty map),
        # so a job compiles them with its first cache, not when its cache first grows
        SK.compact(self.st, self.skey, self.rows, self.dirty, self.pins, self.freq, self.where, self.stamp,
                   self.prev, self.nxt, self.bkt, self.bhead, self.btail, self.free, n)
        SK.rebuild_map(self.skey, self.where, self.mkeys, self.mvals)
        SK.spread_ghost(self.ghost, 0)
        SK.fold_ghost(self.ghost, self.ghost.shape[0])

    def _bind(self, name: str, a: np.ndarray) -> None:
        """Make ``a`` the array ``name`` (``meta``: the records, whose fields the kernels take as arrays)."""
        setattr(self, name, a)
        if name == "meta":
            for f in _FIELDS:
                setattr(self, f, a[f])

    @property
    def nbytes(self) -> int:
        arrays = (self.st, self.rows, self.meta, self.bhead, self.btail, self.free, self.mkeys, self.mvals, self.ghost)
        return sum(a.nbytes for a in arrays)

    @property
    def n_free(self) -> int:
        return int(self.st[P.ST_FREE_TOP])

    # -- the operation kernels over this state (REQUIRES: the cache's lock held, inputs validated)
    def lookup(self, k, c, pin: bool, out, hit) -> int:
        return K.lookup(self.st, self.skey, self.rows, self.pins, self.freq, self.where, self.stamp, self.prev,
                        self.nxt, self.bkt, self.bhead, self.btail, self.mkeys, self.mvals, k, c, pin, out, hit)

    def put(self, k, r, d, f, pin: bool, ev, at=NO_AT) -> int:
        """``ev``: an ``Evicted`` with room for ``k.shape[0]`` victims; the row of ``k[i]`` is ``r[at[i]]``
        (``at`` empty: ``r[i]``). -> victims written."""
        return K.put(self.st, self.skey, self.rows, self.dirty, self.pins, self.freq, self.where, self.stamp,
                     self.prev, self.nxt, self.bkt, self.bhead, self.btail, self.free, self.mkeys, self.mvals,
                     self.ghost, k, r, at, d, f, pin, ev.keys, ev.rows, ev.dirty, ev.freq)

    def unpin(self, k) -> int:
        return K.unpin(self.st, self.pins, self.freq, self.where, self.stamp, self.prev, self.nxt, self.bkt,
                       self.bhead, self.btail, self.mkeys, self.mvals, k)

    def evict(self, n_free: int, ev):
        """Evict until ``n_free`` slots are free, into ``ev`` (REQUIRES: room for the victims, and
        that many evictable rows) -> (ev, victims written)."""
        n = K.make_room(self.st, self.skey, self.rows, self.dirty, self.freq, self.where, self.prev, self.nxt,
                        self.bkt, self.bhead, self.btail, self.free, self.mkeys, self.mvals, self.ghost, n_free,
                        ev.keys, ev.rows, ev.dirty, ev.freq)
        return ev, n

    def take(self, k, slots, out, at, hit) -> int:
        return int(K.take(self.st, self.skey, self.rows, self.dirty, self.pins, self.freq, self.where, self.prev,
                          self.nxt, self.bkt, self.bhead, self.btail, self.free, self.mkeys, self.mvals, self.ghost,
                          k, slots, out, at, hit))

    def discard(self, k) -> int:
        return int(K.discard(self.st, self.skey, self.dirty, self.pins, self.freq, self.where, self.prev, self.nxt,
                             self.bkt, self.bhead, self.btail, self.free, self.mkeys, self.mvals, self.ghost, k))

    def dirty_slots(self, start: int, limit: int) -> np.ndarray:
        """(m,) int64: the first ``limit`` slots at or past ``start`` that hold a dirty row."""
        out = np.empty(min(int(limit), max(0, self.n - int(start))), dtype=np.int64)
        return out[:SK.dirty_slots_from(self.dirty, self.where, int(start), out)]

    # -- size
    def resize(self, n_slots: int, limit: int | None = None) -> None:
        """Grow or shrink to ``n_slots`` slots. Shrinking first moves the rows of the slots that go
        into free slots below (REQUIRES: at most ``n_slots`` rows cached). ``limit``: the slots a
        reservation made now should hold (the cache's capacity), when growth outruns the one made
        before (a capacity raised since). Growth is all or nothing: when the system refuses the
        memory of one array, every array is as it was and CacheBudgetError says so."""
        n, old = int(n_slots), self.n
        if n == old:
            return
        lim = max(n, int(limit or n))
        if n > old:
            self._grow(n, lim)
            return
        SK.compact(self.st, self.skey, self.rows, self.dirty, self.pins, self.freq, self.where, self.stamp,
                   self.prev, self.nxt, self.bkt, self.bhead, self.btail, self.free, n)
        for name in _GROWING:   # compact left the free slots below n on the stack
            self._bind(name, self._res[name].view(n))
        self.n = n
        g = ghost_cells(n, self.ghost_factor)
        if g < self.ghost.shape[0]:
            SK.fold_ghost(self.ghost, g)
            self.ghost = self._res["ghost"].view(g)
        m = map_cells(n)
        if m != self.mkeys.shape[0]:
            self.mkeys, self.mvals = self._res["mkeys"].view(m), self._res["mvals"].view(m)
        SK.rebuild_map(self.skey, self.where, self.mkeys, self.mvals)   # rows moved to other slots

    def _grow(self, n: int, lim: int) -> None:
        """``resize`` to ``n > self.n`` slots: take every longer view first (the only step that can
        fail), then lay out the new slots, the free stack, the ghost cells and the map."""
        old, top, old_g = self.n, self.n_free, self.ghost.shape[0]
        sizes = {name: (n, lim) for name in _GROWING}
        g = ghost_cells(n, self.ghost_factor)
        if g != old_g:
            sizes["ghost"] = (g, ghost_cells(lim, self.ghost_factor))
        m = map_cells(n)
        if m != self.mkeys.shape[0]:
            sizes["mkeys"] = sizes["mvals"] = (m, map_cells(lim))
        taken = []
        try:
            for name, (size, reserve) in sizes.items():
                now = getattr(self, name).shape[0]
                self._bind(name, self._res[name].view(size, reserve))   # the new part reads as zeros
                taken.append((name, now))
        except BaseException as e:
            for name, now in taken:   # back to the old length (of a new mapping, if one was made)
                self._bind(name, self._res[name].view(now))
            if isinstance(e, OSError):
                raise CacheBudgetError(
                    f"the system refused the memory to grow a DRAM cache from {old:,} to {n:,} slots "
                    f"({slots_bytes(n, self.rows.shape[1] * self.rows.itemsize, self.ghost_factor):,} B): {e}; "
                    "the cache is as it was: lower the memory budget (--mem-budget) or free memory") from e
            raise
        SK.free_slots_from(self.skey, self.prev, self.nxt, old)
        # new slots go *under* the free ones: the stack of a cache allocated at full size
        self.free[n - old:n - old + top] = self.free[:top].copy()
        self.free[:n - old] = np.arange(n - 1, old - 1, -1, dtype=np.int32)
        self.st[P.ST_FREE_TOP] = top + n - old
        self.n = n
        if "ghost" in sizes and old_g:
            SK.spread_ghost(self.ghost, old_g)
        if "mkeys" in sizes:
            SK.rebuild_map(self.skey, self.where, self.mkeys, self.mvals)

