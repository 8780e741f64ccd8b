"""Dict model of :class:`hps.HashTable` as the HBM-PS cache across batches (``hps/table/_cache.py``): rows,
and per key (uses, last batch) -- the LFU and LRU halves of the paper's policy -- with victims taken in
ascending (uses, last batch, key) among keys not looked up since the protected batch."""

from __future__ import annotations

import numpy as np

COUNT_MAX = 2**32 - 1


class ScoredDict:
    def __init__(self, dim: int, dtype=np.float32):
        self.dim, self.dtype = dim, np.dtype(dtype)
        self.rows: dict[int, np.ndarray] = {}
        self.uses: dict[int, tuple[int, int]] = {}

    def __len__(self):
        return len(self.rows)

    def insert(self, keys, rows):
        for k, r in zip(keys.tolist(), rows):
            self.uses.setdefault(k, (0, 0))  # a new key starts unused; a live one keeps its history
            self.rows[k] = np.array(r, self.dtype)

    def erase(self, keys):
        for k in keys.tolist():
            self.rows.pop(k, None)
            self.uses.pop(k, None)

    def lookup(self, keys, batch):
        """found (n,) bool; every live key counts a use in ``batch``."""
        found = np.zeros(len(keys), bool)
        for i, k in enumerate(keys.tolist()):
            if k in self.rows:
                c, last = self.uses[k]
                self.uses[k] = (min(c + 1, COUNT_MAX), max(last, batch))
                found[i] = True
        return found

    def evict(self, n, protect_from):
        """(keys (k,) uint64 in key order, rows (k, dim)) of the victims, erased."""
        eligible = [k for k in self.rows if self.uses[k][1] < protect_from]
        eligible.sort(key=lambda k: (self.uses[k][0], self.uses[k][1], k))
        chosen = np.array(sorted(eligible[:n]), np.uint64)
        rows = np.array([self.rows[int(k)] for k in chosen], self.dtype).reshape(-1, self.dim)
        self.erase(chosen)
        return chosen, rows


def random_ops(seed, n_ops=40, universe=60, dim=3):
    """A reproducible sequence of cache operations: ("insert", keys, rows), ("lookup", keys, batch),
    ("erase", keys), ("evict", n, protect_from), ("purge",), ("reserve", extra). Keys come from a small
    universe (collisions, revivals, ties of scores) and batch indices increase."""
    rng = np.random.default_rng(seed)
    ops, batch = [], 0
    for _ in range(n_ops):
        kind = rng.choice(["insert", "lookup", "lookup", "erase", "evict", "purge", "reserve"],
                          p=[.3, .2, .15, .1, .15, .05, .05])
        keys = np.unique(rng.integers(1, universe, rng.integers(1, 12)).astype(np.uint64))
        rng.shuffle(keys)
        if kind == "insert":
            ops.append(("insert", keys, rng.normal(size=(keys.shape[0], dim)).astype(np.float32)))
        elif kind == "lookup":
            batch += int(rng.integers(0, 3))
            ops.append(("lookup", keys, batch))
        elif kind == "erase":
            ops.append(("erase", keys))
        elif kind == "evict":
            ops.append(("evict", int(rng.integers(0, 8)), int(rng.integers(0, batch + 2))))
        elif kind == "purge":
            ops.append(("purge",))
        else:
            ops.append(("reserve", int(rng.integers(1, 40))))
    return ops


def replay(table, ops, capacity_of=lambda t: t.capacity):
    """Run ``ops`` on ``table`` (HashTable or ScoredDict); returns the outputs of lookups and evictions
    (found flags, victims' keys and rows) and the final sorted export."""
    out = []
    for op in ops:
        if op[0] == "insert":
            if isinstance(table, ScoredDict):
                table.insert(op[1], op[2])
            else:
                table.reserve(len(table) + op[1].shape[0])
                table.insert(op[1], op[2])
        elif op[0] == "lookup":
            got = table.lookup(op[1], op[2])
            out.append(("lookup", got if isinstance(table, ScoredDict) else np.asarray(got) >= 0))
        elif op[0] == "erase":
            table.erase(op[1])
        elif op[0] == "evict":
            k, r = table.evict(op[1], op[2])
            out.append(("evict", np.asarray(k), np.asarray(r)))
        elif op[0] == "purge" and not isinstance(table, ScoredDict):
            table.purge()
        elif op[0] == "reserve" and not isinstance(table, ScoredDict):
            table.reserve(capacity_of(table) + op[1])
    if isinstance(table, ScoredDict):
        keys = np.array(sorted(table.rows), np.uint64)
        vals = np.array([table.rows[int(k)] for k in keys], np.float32).reshape(-1, table.dim)
    else:
        keys, vals = table.export()
        o = np.argsort(keys)
        keys, vals = keys[o], vals[o]
    out.append(("export", keys, vals))
    return out


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x[0] == y[0]
        for u, v in zip(x[1:], y[1:]):
            np.testing.assert_array_equal(u, v)
