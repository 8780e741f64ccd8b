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
