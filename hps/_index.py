"""``KeyIndex``: a growable key -> int64 row index built on the CPU hash-table kernels.

The tiers use it for their bookkeeping (SSD-PS key -> (file, slot); MEM-PS key -> cache slot).
Unlike :class:`hps.HashTable` it grows: when a call would pass the capacity it rebuilds into a
table twice as large (host-side allocation, outside any kernel).

Not thread-safe: callers serialise access.
"""

from __future__ import annotations

import numpy as np

from . import _table_cpu_kernels as K
from ._keys import as_keys
from ._table_cpu import CpuTableImpl
from .table import DEFAULT_MAX_LOAD_FACTOR, slots_for


class KeyIndex:
    """key (uint64) -> row (width,) int64. Missing keys read as zeros with found=False."""

    def __init__(self, width: int = 1, capacity: int = 1024,
                 max_load_factor: float = DEFAULT_MAX_LOAD_FACTOR):
        self.width = int(width)
        self._mlf = float(max_load_factor)
        self._alloc(max(16, int(capacity)))

    def _alloc(self, capacity: int) -> None:
        self.capacity = capacity
        self._impl = CpuTableImpl(slots_for(capacity, self._mlf), self.width, np.int64)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def _reserve(self, n: int) -> None:
        if self._size + self._impl.tombstones + n <= self.capacity:
            return
        keys, vals = self.items()
        self._alloc(max(self.capacity, 2 * (self._size + n)))
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

    def exchange(self, keys, vals):
        """Assign like :meth:`assign` and return what each key held just before its own write:
        ``(old (n, width) int64, had (n,) bool)``; a repeated key sees its earlier occurrence's value."""
        k, v = self._prepare(keys, vals)
        old = np.zeros((k.shape[0], self.width), dtype=np.int64)
        had = np.zeros(k.shape[0], dtype=np.bool_)
        if k.shape[0]:
            n_new, n_revived = K.exchange(self._impl.tkeys, self._impl.tstate, self._impl.tvals, k, v, old, had)
            self._size += int(n_new)
            self._impl.tombstones -= int(n_revived)
        return old, had

    def _prepare(self, keys, vals):
        """Validated (keys, (n, width) int64 values), with room reserved for every key."""
        k = as_keys(keys)
        v = np.ascontiguousarray(np.asarray(vals, dtype=np.int64).reshape(k.shape[0], self.width))
        if k.shape[0]:
            self._reserve(k.shape[0])
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
