"""``replay``: run the real :class:`RowCache` over a trace of batches and report its hit rate."""

from __future__ import annotations

import numpy as np

from .._keys import as_keys
from ..errors import InvalidInputError
from ._cache import DEFAULT_GHOST_FACTOR, DEFAULT_LRU_FRACTION, RowCache
from ._unique import unique_counts

#: Policy name -> (lru_fraction, ghost_factor) of the RowCache that plays it.
POLICIES = {
    "lru": (1.0, 0.0),
    "lfu": (0.0, 0.0),
    "lru+lfu": (DEFAULT_LRU_FRACTION, DEFAULT_GHOST_FACTOR),
}


def replay(batches, capacity: int, policy: str = "lru+lfu", *, lru_fraction: float | None = None,
           ghost_factor: float | None = None) -> dict:
    """Replay ``batches`` (an iterable of (n_b,) uint64 key arrays) through a ``RowCache`` of
    ``capacity`` rows playing ``policy`` ("lru", "lfu" or "lru+lfu"; ``lru_fraction`` /
    ``ghost_factor`` override the policy's settings).

    Per batch, as MEM-PS does: every access (repeats included) counts toward frequencies; the
    distinct keys are looked up and pinned; misses are inserted pinned; the batch is unpinned at its
    end. Hits and misses count distinct keys per batch. Blocking; single-threaded.

    -> dict(hits, misses, hit_rate, per_batch (n_batches,) float64 hit rates)."""
    if policy not in POLICIES:
        raise InvalidInputError(f"policy must be one of {sorted(POLICIES)}, got {policy!r}")
    lf, gf = POLICIES[policy]
    cache = RowCache(capacity, 1, np.float32,
                     lru_fraction=lf if lru_fraction is None else lru_fraction,
                     ghost_factor=gf if ghost_factor is None else ghost_factor)
    for batch in batches:
        uniq, counts, _ = unique_counts(as_keys(batch))
        cache.visit_batch(uniq, counts)
    st = cache.stats()
    hits = st.per_batch_hits
    total = hits + st.per_batch_misses
    per_batch = np.divide(hits, total, out=np.zeros(hits.shape[0]), where=total > 0)
    return dict(hits=st.hits, misses=st.misses, hit_rate=st.hit_rate, per_batch=per_batch)
