"""MEM-PS: the DRAM tier of hps — an LRU+LFU row cache with pinning over the SSD-PS.

Public API::

    from hps.mem import RowCache, MemPS, RowInitializer, replay, owner_of

- :class:`RowCache` — batch-only DRAM cache of fixed-width rows (Appendix D policy: LRU part, then
  LFU part, evicted rows handed back with dirty flags; pinned rows never evicted).
- :func:`replay` — hit rate of the real cache over a trace of key batches ("lru", "lfu", "lru+lfu").
- :class:`MemPS` — one node's shard: the cache over an ``hps.ssd.SSDStore``; ``pull`` / ``push`` /
  ``flush``; dirty rows always reach the store.
- :class:`MemConfig` — the settings of ``MemPS.from_config`` (budget, LRU share, ghost, initializer),
  validated.
- :class:`RowInitializer` — deterministic per-key initial rows (same key, same row, anywhere).
- :func:`owner_of` — the key -> node partition policy: ``owner_of(keys, n_nodes)`` is
  ``mix64(key ^ NODE_SALT) % n_nodes`` (SplitMix64 finaliser; ``NODE_SALT`` =
  0x5BD1E9955BD1E995). It is stable across runs and independent of the GPU-part policy
  (``PART_SALT``); changing the salt changes which rank owns which key. keys (m,) uint64 ->
  (m,) int32 host array.
"""

from .._hashing import NODE_SALT, owner_of
from ._cache import DEFAULT_GHOST_FACTOR, DEFAULT_LRU_FRACTION, CacheStats, Evicted, RowCache
from ._unique import DedupScratch, unique_counts, unique_keys, unique_segments
from ._config import MemConfig
from ._init import RowInitializer
from ._memps import MemPS
from ._replay import POLICIES, replay

__all__ = [
    "RowCache",
    "Evicted",
    "CacheStats",
    "DEFAULT_LRU_FRACTION",
    "DEFAULT_GHOST_FACTOR",
    "MemPS",
    "MemConfig",
    "RowInitializer",
    "replay",
    "POLICIES",
    "owner_of",
    "NODE_SALT",
    "unique_counts",
    "unique_keys",
    "unique_segments",
    "DedupScratch",
]
