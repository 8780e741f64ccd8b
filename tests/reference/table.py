"""Dict model of :class:`hps.HashTable` (the semantics, not the speed)."""

from __future__ import annotations

import numpy as np

from hps.errors import HashTableFullError


class DictTable:
    def __init__(self, capacity: int, dim: int, dtype=np.float32):
        self.capacity, self.dim, self.dtype = capacity, dim, np.dtype(dtype)
        self.d: dict[int, np.ndarray] = {}

    def __len__(self):
        return len(self.d)

    def _check_room(self, keys):
        new = {int(k) for k in keys} - self.d.keys()
        if len(self.d) + len(new) > self.capacity:
            raise HashTableFullError("full")

    def insert(self, keys, values):
        self._check_room(keys)
        for k, v in zip(keys, values):
            self.d[int(k)] = np.array(v, dtype=self.dtype)

    def accumulate(self, keys, deltas):
        self._check_room(keys)
        for k, v in zip(keys, deltas):
            self.d[int(k)] = self.d.get(int(k), np.zeros(self.dim, self.dtype)) + np.asarray(v, self.dtype)

    def get(self, keys):
        vals = np.zeros((len(keys), self.dim), self.dtype)
        found = np.zeros(len(keys), bool)
        for i, k in enumerate(keys):
            if int(k) in self.d:
                vals[i], found[i] = self.d[int(k)], True
        return vals, found

    def contains(self, keys):
        return np.array([int(k) in self.d for k in keys], dtype=bool)

    def erase(self, keys):
        return sum(self.d.pop(k, None) is not None for k in {int(k) for k in keys})

    def export(self):
        ks = np.array(sorted(self.d), dtype=np.uint64)
        return ks, np.array([self.d[int(k)] for k in ks], dtype=self.dtype).reshape(len(ks), self.dim)

    def clear(self):
        self.d.clear()

    def reserve(self, capacity):
        """Grow (never shrink) the capacity; every entry stays."""
        self.capacity = max(self.capacity, int(capacity))

    def purge(self):
        """Tombstones are a layout detail: nothing observable changes."""
