"""What ``RowCache`` (``_cache``) takes and gives back, apart from its rows: the default policy settings,
the rows it evicts (:class:`Evicted`), its counters (:class:`CacheStats`) and the DRAM a cache of given
settings allocates (:func:`cache_bytes`, :func:`cache_rows_for_bytes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ._cache_state import N_BUCKETS, N_STATE

#: Default share of the capacity given to the LRU part (the rest is the LFU part). Measured with
#: ``bench/bench_cache.py`` (Zipf, 200 k keys, fraction of Belady; ghost_factor 4):
#: lru_fraction 0.05 / 0.01 / 0.0 -> alpha 0.8 cache 2 %: 0.749 / 0.782 / 0.789;
#: alpha 1.0 cache 10 %: 0.879 / 0.880 / 0.880; alpha 1.0 cache 2 %: 0.828 / 0.838 / 0.840.
DEFAULT_LRU_FRACTION = 0.01
#: Default ghost table, in multiples of the capacity (16 bytes a cell). Same sweep, alpha 1.0 cache
#: 10 %, lru_fraction 0.05: ghost 0 / 1 / 2 / 4 -> 0.855 / 0.873 / 0.876 / 0.879 of Belady.
DEFAULT_GHOST_FACTOR = 4.0


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


def pow2_at_least(n: int) -> int:
    m = 16
    while m < n:
        m *= 2
    return m


def cache_bytes(capacity_rows: int, row_width: int, dtype=np.float32,
                ghost_factor: float = DEFAULT_GHOST_FACTOR) -> int:
    """DRAM a cache of these settings allocates: rows, per-slot state, key map and ghost table
    (what ``RowCache.nbytes`` reports once it exists)."""
    c = int(capacity_rows)
    per_slot = (int(row_width) * np.dtype(dtype).itemsize + 8 + 1 + 4 + 8 + 1 + 8 + 4 + 4 + 4 + 4)
    g = int(round(float(ghost_factor) * c))
    g = pow2_at_least(g) if g else 0
    return (c * per_slot + 12 * pow2_at_least(2 * c) + 16 * g + 8 * N_STATE
            + 8 * (N_BUCKETS + 1))


def cache_rows_for_bytes(n_bytes: int, row_width: int, dtype=np.float32,
                         ghost_factor: float = DEFAULT_GHOST_FACTOR) -> int:
    """The largest capacity (rows) whose :func:`cache_bytes` fits in ``n_bytes`` (0 if none)."""
    lo, hi = 0, max(1, int(n_bytes) // max(1, int(row_width) * np.dtype(dtype).itemsize))
    while lo < hi:   # cache_bytes grows with the capacity: binary search
        mid = (lo + hi + 1) // 2
        if cache_bytes(mid, row_width, dtype, ghost_factor) <= n_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo
