"""Dict model of :class:`hps.ssd.SSDStore` (the semantics, not the speed or the files)."""

from __future__ import annotations

import numpy as np


class DictStore:
    def __init__(self, dim: int, dtype=np.float32):
        self.dim, self.dtype = dim, np.dtype(dtype)
        self.d: dict[int, np.ndarray] = {}

    def __len__(self):
        return len(self.d)

    def dump(self, keys, rows):
        for k, r in zip(np.asarray(keys, dtype=np.uint64).tolist(), np.asarray(rows)):
            self.d[k] = np.array(r, dtype=self.dtype)   # later duplicates win

    def delete(self, keys) -> int:
        return sum(self.d.pop(k, None) is not None for k in np.unique(np.asarray(keys, dtype=np.uint64)).tolist())

    def load(self, keys):
        keys = np.asarray(keys, dtype=np.uint64)
        out = np.zeros((keys.shape[0], self.dim), dtype=self.dtype)
        found = np.zeros(keys.shape[0], dtype=bool)
        for i, k in enumerate(keys.tolist()):
            if k in self.d:
                out[i], found[i] = self.d[k], True
        return out, found

    def load_into(self, keys, out, at):
        rows, found = self.load(keys)
        out[np.asarray(at)[found]] = rows[found]
        return found

    def items(self):
        ks = sorted(self.d)
        rows = np.array([self.d[k] for k in ks], dtype=self.dtype).reshape(len(ks), self.dim)
        return np.array(ks, dtype=np.uint64), rows
