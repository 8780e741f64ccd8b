"""``KeyIndex``: a growable key -> int64 row index built on the CPU hash-table kernels.

The tiers use it for their bookkeeping: the SSD-PS maps key -> (file, slot), the residency hierarchy
of the trainer key -> last batch that used it. (The MEM-PS cache keeps its own map inside its kernels.)
Unlike :class:`hps.HashTable` it grows: when a call would pass the capacity it rebuilds into a
table twice as large (host-side allocation, outside any kernel).

Two-phase writes (:meth:`KeyIndex.stage`, :meth:`KeyIndex.publish`) let a caller do the expensive
part of a batch update before the new values may be seen (the SSD-PS stages a dump's keys while its
files are written and publishes them once they are durable). Both phases walk the table in home-slot
order: on a table bigger than the CPU caches, probing in key order costs a cache miss per array per
key, probing in slot order streams (about 3x faster for 262 k keys into a 1 M-slot index).

Not thread-safe: callers serialise access.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .table import _cpu_kernels as K
from ._keys import as_keys
from .table._cpu import CpuTableImpl
from .table import DEFAULT_MAX_LOAD_FACTOR, slots_for


class Staged(NamedTuple):
    """A batch of keys staged by :meth:`KeyIndex.stage`, in home-slot order."""

    order: np.ndarray   # (n,) int64: positions in the caller's batch, in home-slot order
    keys: np.ndarray    # (n,) uint64: keys[order]
    slots: np.ndarray   # (n,) int64: the slot of each key in the table it was staged in
    table: object       # that table: publish restages when the index was rebuilt meanwhile


class KeyIndex:
    """key (uint64) -> row (width,) int64. Missing keys read as zeros with found=False."""

    def __init__(self, width: int = 1, capacity: int = 1024,
                 max_load_factor: float = DEFAULT_MAX_LOAD_FACTOR):
        self.width = int(width)
        self._mlf = float(max_load_factor)
        self._alloc(max(16, int(capacity)))

    def _alloc(self, capacity: int) -> None:
        n_slots = slots_for(capacity, self._mlf)
        self.capacity = int(n_slots * self._mlf)   # what the slots hold (a power of two: >= capacity)
        self._impl = CpuTableImpl(n_slots, self.width, np.int64, scores=False)   # its pages written (faulted in)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @property
    def nbytes(self) -> int:
        """Bytes of DRAM the index's arrays hold."""
        t = self._impl
        return t.tkeys.nbytes + t.tstate.nbytes + t.tvals.nbytes

    @property
    def room(self) -> int:
        """Keys that can be written before the index rebuilds (a write reserves room for each)."""
        return self.capacity - self._size - self._impl.tombstones

    def peak_bytes(self, n_more: int) -> int:
        """The most DRAM this index holds at once while ``n_more`` more keys (new or not: a write
        reserves room for each) are written, with no erase meanwhile: its arrays now, or, at each
        rebuild they cause, the old and the new arrays plus what moves between them (the live
        slots, keys and values). The bound holds whatever the calls' sizes: calls of one key each
        rebuild at every doubling, and peak highest; a larger call skips rebuilds, and its one
        rebuild peaks lower (:func:`growth_peak`, exact for single-key calls)."""
        t = self._impl
        return max(self.nbytes, growth_peak(self._size, t.tombstones, t.tkeys.shape[0], int(n_more),
                                            self.width, self._mlf))

    def reserve(self, n: int) -> None:
        """Make room for ``n`` more keys (a rebuild, when needed, happens here: :func:`rebuilt_capacity`)."""
        if self._size + self._impl.tombstones + n <= self.capacity:
            return
        keys, vals = self.items()
        self._alloc(rebuilt_capacity(self.capacity, self._size + n))
        if keys.shape[0]:
            self._size += self._impl.upsert(keys, vals, False)[0]

    def lookup(self, keys):
        """-> (vals (n, width) int64, found (n,) bool)."""
        return self._impl.get(as_keys(keys))

    def contains(self, keys):
        return self._impl.contains(as_keys(keys))

    def assign(self, keys, vals) -> None:
        """Insert or assign; later duplicates win. vals (n, width) int64 (or (n,) when width == 1)."""
        self._write(keys, vals, False)

    def add(self, keys, deltas) -> None:
        """Add ``deltas``; missing keys start from 0; duplicates all add up."""
        self._write(keys, deltas, True)

    def stage(self, keys) -> Staged:
        """First half of a two-phase assign: sort ``keys`` by home slot, make room and find or claim
        a slot for each -> :class:`Staged`. Nothing changes for readers: a key new to the index is
        claimed as a tombstone, which lookups miss until :meth:`publish`. An abandoned stage leaves
        those tombstones behind (harmless; a rebuild drops them)."""
        k = as_keys(keys)
        n = k.shape[0]
        self.reserve(n)
        t = self._impl
        n_slots = t.tkeys.shape[0]
        # about n/2 buckets of adjacent slots: the counts stay in cache and the probes move forward
        shift = max(0, n_slots.bit_length() - 1 - max(0, n.bit_length() - 2))
        order = np.empty(n, dtype=np.int64)
        skeys = np.empty(n, dtype=np.uint64)
        slots = np.empty(n, dtype=np.int64)
        K.slot_order(k, np.uint64(n_slots - 1), np.uint64(shift), order, skeys)
        t.tombstones += int(K.claim_hidden(t.tkeys, t.tstate, skeys, slots))
        return Staged(order, skeys, slots, t)

    def publish(self, staged: Staged, vals):
        """Second half: assign ``vals`` ((n, width), in ``staged.order``) to the staged keys (later
        duplicates win) -> ``(order, old (n, width), had (n,))``: what each key held just before
        its own write (a repeated key sees its earlier occurrence's value), in ``order`` (a new
        order only when the index was rebuilt since :meth:`stage`, which restages; otherwise
        ``staged.order``)."""
        v = np.ascontiguousarray(np.asarray(vals, dtype=np.int64).reshape(staged.keys.shape[0], self.width))
        order = staged.order
        if staged.table is not self._impl:
            again = self.stage(staged.keys)    # positions in staged.keys: compose with staged.order
            order, v, staged = order[again.order], v[again.order], again
        t = self._impl
        old = np.empty_like(v)
        had = np.empty(v.shape[0], dtype=np.bool_)
        n_revived = int(K.publish(t.tstate, t.tvals, staged.slots, v, old, had))
        t.tombstones -= n_revived
        self._size += n_revived
        return order, old, had

    def _prepare(self, keys, vals):
        """Validated (keys, (n, width) int64 values), with room reserved for every key."""
        k = as_keys(keys)
        v = np.ascontiguousarray(np.asarray(vals, dtype=np.int64).reshape(k.shape[0], self.width))
        if k.shape[0]:
            self.reserve(k.shape[0])
        return k, v

    def _write(self, keys, vals, accumulate: bool) -> None:
        k, v = self._prepare(keys, vals)
        if k.shape[0] == 0:
            return
        self._size += self._impl.upsert(k, v, accumulate)[0]

    def erase(self, keys) -> int:
        k = as_keys(keys)
        n = self._impl.erase(k) if k.shape[0] else 0
        self._size -= n
        return n

    def items(self):
        """(keys (m,) uint64, vals (m, width) int64) of every entry, in slot order."""
        return self._impl.export()

    def clear(self) -> None:
        self._impl.clear()
        self._size = 0


#: Bytes of an index's slot per value column (the int64 value) and besides (key u64, state i32); bytes a
#: rebuild moves per live entry besides its values (its slot and key).
SLOT_VALUE_BYTES, SLOT_BYTES, MOVED_BYTES = 8, 12, 16


def rebuilt_capacity(capacity: int, need: int) -> int:
    """The capacity (keys) :meth:`KeyIndex.reserve` rebuilds an index of ``capacity`` into when its
    live keys and the call's make ``need``: twice as many (or what ``need`` takes), unless tombstones
    filled it (``need`` at most half of it): then as many, the tombstones dropped."""
    return max(2 * int(capacity), int(need)) if need > capacity // 2 else int(capacity)


def growth_peak(size: int, tombstones: int, slots: int, n_more: int, width: int,
                max_load_factor: float = DEFAULT_MAX_LOAD_FACTOR) -> int:
    """The most bytes an index of ``width`` values, ``slots`` slots, ``size`` live keys and
    ``tombstones`` holds at a rebuild while ``n_more`` new keys are written one a call (old and new
    arrays and the live entries moved: :meth:`KeyIndex.reserve`); 0 when none rebuilds. The path
    :meth:`KeyIndex.reserve` takes, a rebuild at a time: a call fills the index to its capacity, and
    the next key rebuilds it."""
    per_slot, moved = SLOT_BYTES + SLOT_VALUE_BYTES * int(width), MOVED_BYTES + SLOT_VALUE_BYTES * int(width)
    left, peak = int(n_more), 0
    used, size = int(size) + int(tombstones), int(size)
    cap = int(slots * max_load_factor)
    while left > 0:
        fill = max(0, min(left, cap - used))     # the keys that fit before a rebuild
        used, size, left = used + fill, size + fill, left - fill
        if left == 0:
            break
        new = slots_for(rebuilt_capacity(cap, size + 1), max_load_factor)   # the next key rebuilds
        peak = max(peak, per_slot * (slots + new) + moved * size)
        slots, cap = new, int(new * max_load_factor)
        used, size, left = size + 1, size + 1, left - 1
    return peak


def warm_up() -> None:
    """Compile (or load from Numba's cache) the kernels of an index's growth (:meth:`KeyIndex.reserve`:
    the export and the re-insert of a rebuild), which a large table reaches and a training job's
    scratch warm-up (``hps/train/_warmup.py``) on tiny batches does not."""
    index = KeyIndex(width=2, capacity=16)
    index.assign(np.arange(64, dtype=np.uint64), np.zeros((64, 2), np.int64))   # past 16 keys: a rebuild
