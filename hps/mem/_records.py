"""What a ``RowCache`` hands out: the rows it evicted, and its counters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class Evicted(NamedTuple):
    """Rows that left the cache. keys (m,) uint64, rows (m, W), dirty (m,) bool, freq (m,) int64.
    Only ``dirty`` rows need dumping; ``freq`` lets a caller re-insert them unchanged."""

    keys: np.ndarray
    rows: np.ndarray
    dirty: np.ndarray
    freq: np.ndarray


@dataclass(frozen=True)
class CacheStats:
    """Counters since construction (``per_batch_*`` have one entry per ``lookup`` or ``visit_batch`` call)."""

    capacity_rows: int
    size: int
    pinned: int
    dirty: int
    hits: int
    misses: int
    inserted: int
    evicted: int
    evicted_dirty: int
    per_batch_hits: np.ndarray
    per_batch_misses: np.ndarray

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else 0.0


class CacheCounters:
    """The counters behind :meth:`RowCache.stats`: hits and misses (one batch per ``lookup``,
    ``visit_batch`` or ``take`` call), rows inserted, evicted and evicted dirty. Not thread-safe:
    REQUIRES the owning cache's lock."""

    def __init__(self):
        self.hits = self.misses = self.inserted = self.evicted = self.evicted_dirty = 0
        self.batch_hits: list[int] = []
        self.batch_misses: list[int] = []

    def batch(self, n_hit: int, n_miss: int) -> None:
        """One call's hits and misses."""
        self.hits += int(n_hit)
        self.misses += int(n_miss)
        self.batch_hits.append(int(n_hit))
        self.batch_misses.append(int(n_miss))

    def left(self, ev: Evicted, sign: int = 1) -> None:
        """Rows ``ev`` left the cache (``sign`` -1: they were restored, as if they never had)."""
        self.evicted += sign * ev.keys.shape[0]
        self.evicted_dirty += sign * int(ev.dirty.sum())

    def stats(self, capacity_rows: int, size: int, pinned: int, dirty: int) -> CacheStats:
        return CacheStats(capacity_rows=capacity_rows, size=size, pinned=pinned, dirty=dirty, hits=self.hits,
                          misses=self.misses, inserted=self.inserted, evicted=self.evicted,
                          evicted_dirty=self.evicted_dirty,
                          per_batch_hits=np.array(self.batch_hits, dtype=np.int64),
                          per_batch_misses=np.array(self.batch_misses, dtype=np.int64))
