"""Reference LRU+LFU row cache with pinning: the semantics of :class:`hps.mem.RowCache`, by the book.

Slow and obvious: dicts, an ordered dict for the LRU part, ``min`` over the LFU part. The fast cache
must make exactly the same decisions (hits, victims and their order, budget errors).

- Every touched row enters the LRU part (most recent last); while the LRU part holds more than
  ``lru_target`` rows, its least recent row moves to the LFU part.
- A victim is the LFU row with the smallest (frequency class, LFU entry number), else the least
  recent LRU row. Frequency class: the frequency below 64, then one class per power of two up to
  2**23, then one class for everything above. The entry number counts entries into the LFU part; a
  row whose frequency grows while in the LFU part (a key repeated within one put) re-enters it.
- Pinned rows are in neither part; unpinning to zero puts a row at the LRU's recent end.
- Ghost: a direct-mapped table of ``ghost`` cells (0 or a power of two) of (key, freq) of evicted
  rows, cell ``mix64(key ^ GHOST_SALT) % ghost``; re-inserting a remembered key adds its remembered
  freq and frees its cell. Resized (``resize_ghost``): grown, every key moves to its cell in the
  larger table; shrunk, a key of a cell past the new size moves to its cell modulo the new size when
  that one is empty (cells in ascending order), else it is forgotten.
- ``evict_to(n)`` evicts in victim order until ``n`` rows are left; ``set_capacity`` changes the
  capacity, the LRU target and the ghost size (the rows must fit).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np


GHOST_SALT = 0x2545F4914F6CDD1D
M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """SplitMix64 finaliser (same as hps._hashing.mix64), on Python ints."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def freq_class(f: int) -> int:
    if f < 64:
        return max(f, 0)
    return min(64 + f.bit_length() - 7, 81)


class BudgetExceeded(Exception):
    pass


class RefCache:
    def __init__(self, capacity: int, lru_target: int, ghost: int = 0):
        self.capacity, self.lru_target = capacity, lru_target
        self.e: dict[int, dict] = {}            # key -> row, dirty, pins, freq
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.lfu: dict[int, int] = {}           # key -> its LFU entry number
        self.seq = 0
        self.ghost = [None] * ghost              # (key, freq) or None per cell

    # -- parts
    def _detach(self, k):
        self.lru.pop(k, None)
        self.lfu.pop(k, None)

    def _enter_lfu(self, k):
        self.seq += 1
        self.lfu[k] = self.seq

    def _place_lru(self, k):
        self.lru[k] = None
        while len(self.lru) > self.lru_target:
            old, _ = self.lru.popitem(last=False)
            self._enter_lfu(old)

    def _evict_one(self, out):
        if self.lfu:
            k = min(self.lfu, key=lambda x: (freq_class(self.e[x]["freq"]), self.lfu[x]))
            del self.lfu[k]
        elif self.lru:
            k, _ = self.lru.popitem(last=False)
        else:
            raise AssertionError("nothing evictable")
        ent = self.e.pop(k)
        out.append((k, ent["row"].copy(), ent["dirty"], ent["freq"]))
        if self.ghost:
            self.ghost[mix64(k ^ GHOST_SALT) % len(self.ghost)] = (k, ent["freq"])

    def _ghost_take(self, k) -> int:
        if not self.ghost:
            return 0
        c = mix64(k ^ GHOST_SALT) % len(self.ghost)
        g = self.ghost[c]
        if g is not None and g[0] == k:
            self.ghost[c] = None
            return g[1]
        return 0

    def _touch(self, k, pin: bool):
        ent = self.e[k]
        if pin:
            if ent["pins"] == 0:
                self._detach(k)
            ent["pins"] += 1
        elif ent["pins"] == 0:
            self._detach(k)
            self._place_lru(k)

    @property
    def n_pinned(self):
        return sum(1 for v in self.e.values() if v["pins"] > 0)

    # -- operations
    def lookup(self, keys, pin):
        """keys: list of ints (repeats allowed) -> list of hit bools per key, distinct-hit count."""
        uniq = list(dict.fromkeys(keys))
        counts = {k: keys.count(k) for k in uniq}
        hits = 0
        for k in uniq:
            if k not in self.e:
                continue
            hits += 1
            self.e[k]["freq"] += counts[k]
            self._touch(k, pin)
        return [k in self.e for k in keys], hits

    def put(self, keys, rows, dirty, pin, freq):
        present = [k for k in dict.fromkeys(keys) if k in self.e]
        n_new = sum(1 for k in keys if k not in self.e)
        n_pinned = self.n_pinned
        if pin:
            ws = n_pinned - sum(1 for k in present if self.e[k]["pins"] > 0) + len(present) + n_new
            if ws > self.capacity:
                raise BudgetExceeded(ws)
        elif n_new and n_pinned + n_new > self.capacity:
            raise BudgetExceeded(n_pinned + n_new)
        out = []
        seen = set()
        for k, r, d, f in zip(keys, rows, dirty, freq):
            if k not in self.e:
                if len(self.e) == self.capacity:
                    self._evict_one(out)
                    seen.discard(out[-1][0])   # evicted earlier in this call: a new entry now
                self.e[k] = dict(row=None, dirty=bool(d), pins=0, freq=int(f) + self._ghost_take(k))
            else:
                self.e[k]["freq"] += int(f)
                self.e[k]["dirty"] = self.e[k]["dirty"] or bool(d)
            self.e[k]["row"] = np.array(r, copy=True)
            if k in seen:
                if k in self.lfu:       # its frequency grew in the LFU part: it re-enters
                    self._enter_lfu(k)
                continue
            seen.add(k)
            self._touch(k, pin)
        return out

    def make_room(self, n_free):
        if n_free + self.n_pinned > self.capacity:
            raise BudgetExceeded(n_free + self.n_pinned)
        out = []
        while self.capacity - len(self.e) < n_free:
            self._evict_one(out)
        return out

    def take(self, keys):
        """Distinct keys -> list of hits: a cached row counts one access and leaves unless pinned (its
        frequency to the ghost table); a key not cached adds one access to its ghost cell (taking
        the cell over from another key)."""
        hits = []
        for k in keys:
            if k in self.e:
                hits.append(True)
                ent = self.e[k]
                ent["freq"] += 1
                if ent["pins"] == 0:
                    self._detach(k)
                    del self.e[k]
                    if self.ghost:
                        self.ghost[mix64(k ^ GHOST_SALT) % len(self.ghost)] = (k, ent["freq"])
                continue
            hits.append(False)
            if self.ghost:
                c = mix64(k ^ GHOST_SALT) % len(self.ghost)
                g = self.ghost[c]
                self.ghost[c] = (k, 1 + (g[1] if g is not None and g[0] == k else 0))
        return hits

    def evict_to(self, n_rows):
        out = []
        if len(self.e) > n_rows:
            if self.n_pinned > n_rows:
                raise BudgetExceeded(self.n_pinned)
            while len(self.e) > n_rows:
                self._evict_one(out)
        return out

    def set_capacity(self, capacity, lru_target, ghost):
        assert len(self.e) <= capacity
        self.capacity, self.lru_target = capacity, lru_target
        self.resize_ghost(ghost)

    def resize_ghost(self, n):
        old = self.ghost
        if n >= len(old):
            self.ghost = [None] * n
            for g in old:
                if g is not None:
                    self.ghost[mix64(g[0] ^ GHOST_SALT) % n] = g
        else:
            self.ghost = old[:n]
            for c in range(n, len(old)):
                if old[c] is not None and self.ghost[c % n] is None:
                    self.ghost[c % n] = old[c]

    def unpin(self, keys):
        bad = 0
        for k in dict.fromkeys(keys):
            if k not in self.e or self.e[k]["pins"] == 0:
                bad += 1
                continue
            self.e[k]["pins"] -= 1
            if self.e[k]["pins"] == 0:
                self._place_lru(k)
        return bad

    def update(self, keys, rows):
        found = []
        for k, r in zip(keys, rows):
            found.append(k in self.e)
            if k in self.e:
                self.e[k]["row"] = np.array(r, copy=True)
                self.e[k]["dirty"] = True
        return found
