"""``MemPS``: one node's DRAM parameter server — the :class:`RowCache` over an SSD-PS store."""

from __future__ import annotations

import threading

import numpy as np

from .._keys import as_keys, check_rows
from ..errors import InternalError, InvalidInputError
from . import _cache_kernels as K
from ._cache import DEFAULT_GHOST_FACTOR, DEFAULT_LRU_FRACTION, Evicted, RowCache


class MemPS:
    """The MEM-PS of one node's shard: a DRAM ``RowCache`` in front of ``store``.

    - ``store``: an object with the ``hps.ssd.SSDStore`` API — ``dump(keys, rows)`` (durable on
      return), ``load_into(keys, out, at) -> found`` (rows read straight into place), and
      ``delete(keys)`` for :meth:`delete` — holding rows of ``row_width`` values of ``dtype``.
    - ``budget_bytes`` or ``capacity_rows``: the DRAM budget (exactly one).
    - ``initializer``: rows for keys never seen, ``fill(keys, out, at)`` writing them in place
      (``RowInitializer``).

    Life of a row: ``pull`` pins it (cache hit, else loaded from the store, else born from the
    initializer); ``push`` writes it back dirty and drops the pin; rows leave the cache only when
    room is needed, and dirty ones are dumped to the store *before* their slots are reused. If the
    dump raises, the evicted rows go back into the cache still dirty and the error propagates:
    no update is ever lost. ``flush`` dumps every dirty row. With an exclusive tier above (the
    training hierarchy's HBM-PS), ``take`` moves rows out instead of pinning them, ``push`` brings
    them back dirty, and ``write_through`` stores rows that tier holds without caching them.

    Thread-safe: every public method holds the MemPS lock for its whole call, store I/O included.
    Arrays are host NumPy; every call blocks.
    """

    def __init__(self, store, row_width: int, budget_bytes: int | None = None, initializer=None, *,
                 capacity_rows: int | None = None, dtype=np.float32,
                 lru_fraction: float = DEFAULT_LRU_FRACTION, ghost_factor: float = DEFAULT_GHOST_FACTOR):
        if (budget_bytes is None) == (capacity_rows is None):
            raise InvalidInputError("give exactly one of budget_bytes and capacity_rows")
        if initializer is None:
            raise InvalidInputError("initializer is required (e.g. hps.mem.RowInitializer)")
        row_bytes = int(row_width) * np.dtype(dtype).itemsize
        if capacity_rows is None:
            capacity_rows = int(budget_bytes) // row_bytes
            if capacity_rows < 1:
                raise InvalidInputError(f"budget_bytes={budget_bytes} holds no row of {row_bytes} bytes")
        self.store = store
        self.row_width = int(row_width)
        self.dtype = np.dtype(dtype)
        self.initializer = initializer
        self.cache = RowCache(capacity_rows, row_width, dtype, lru_fraction=lru_fraction,
                              ghost_factor=ghost_factor)
        self._lock = threading.RLock()
        self._ssd_loads = 0
        self._new_rows = 0
        self._dumped = 0

    @classmethod
    def from_config(cls, store, emb_dim: int, row_width: int, cfg) -> "MemPS":
        """A MemPS with a ``RowInitializer`` and budget from ``cfg`` (an ``hps.mem.MemConfig``)."""
        from ._init import RowInitializer

        init = RowInitializer(emb_dim, row_width, seed=cfg.seed, scale=cfg.init_scale,
                              state_value=cfg.init_state)
        return cls(store, row_width, cfg.budget_bytes, init, lru_fraction=cfg.lru_fraction,
                   ghost_factor=cfg.ghost_factor)

    # ------------------------------------------------------------------ internals (lock held)
    def _dump_evicted(self, ev: Evicted) -> None:
        """Dump the dirty rows of ``ev``; on failure put all of ``ev`` back and re-raise.
        REQUIRES: lock held."""
        d = ev.dirty
        if not d.any():
            return
        try:
            if d.all():  # the usual case: no copy of the rows
                self.store.dump(ev.keys, ev.rows)
            else:
                self.store.dump(ev.keys[d], ev.rows[d])
        except BaseException:
            self.cache.restore(ev)
            raise
        self._dumped += int(d.sum())

    def _insert(self, keys, rows, dirty: bool, pin: bool, freq) -> None:
        """Insert distinct uncached ``keys``: make room (dumping dirty victims), then put. Unpinned
        keys go in chunks of the unpinned room, so a push larger than the budget still lands
        (its first rows are dumped by its later ones). REQUIRES: lock held."""
        n = keys.shape[0]
        freq = np.broadcast_to(np.asarray(freq, dtype=np.int64), (n,))
        step = n if pin else max(1, self.cache.capacity_rows - self.cache.n_pinned)
        for a in range(0, n, step):
            b = min(n, a + step)
            ev = self.cache.make_room(b - a)
            self._dump_evicted(ev)
            left = self.cache.put(keys[a:b], rows[a:b], dirty=dirty, pin=pin, freq=freq[a:b])
            if left.keys.shape[0]:  # make_room freed b - a slots: nothing may be evicted here
                raise InternalError(f"MEM-PS: inserting {b - a} rows after making room for them evicted "
                                    f"{left.keys.shape[0]} more")

    # ------------------------------------------------------------------ API
    def pull(self, keys) -> np.ndarray:
        """Rows of ``keys`` (n,) uint64 -> (n, row_width) host array, and pin every distinct key.

        Every occurrence counts as an access. Misses come from the store, else from the
        initializer. Raises CacheBudgetError (nothing pinned by this call) when the pinned rows
        would exceed the budget."""
        k = as_keys(keys)
        uniq, counts, inverse = K.unique_counts(k)
        with self._lock:
            rows, hit = self.cache.lookup(uniq, pin=True, counts=counts)
            miss = np.flatnonzero(~hit)
            if miss.shape[0]:
                mk = uniq[miss]
                try:
                    found = self._fill_misses(mk, rows, miss)
                    self._insert(mk, rows[miss], dirty=False, pin=True, freq=counts[miss])
                except BaseException:
                    self.cache.unpin(uniq[hit])
                    raise
                self._count_loads(found)
        return rows[inverse]

    def _fill_misses(self, keys, rows, at) -> np.ndarray:
        """``rows[at[i]]`` = the row of uncached ``keys[i]``: the store's, read straight into place,
        else born there from the initializer -> found in the store (n,) bool. REQUIRES: lock held."""
        found = self.store.load_into(keys, rows, at)
        if not found.all():
            self.initializer.fill(keys[~found], rows, at[~found])
        return found

    def _count_loads(self, found) -> None:
        n_found = int(found.sum())
        self._ssd_loads += n_found
        self._new_rows += found.shape[0] - n_found

    def take(self, keys) -> np.ndarray:
        """Rows of distinct ``keys`` (n,) uint64 -> (n, row_width) host array, moved out to the caller
        (the HBM-PS), which holds them from now on and ``push``-es them back when done: cached rows
        leave the cache without a dump (a pinned one stays), the others are read from the store
        straight into the result, else born from the initializer there. Nothing is inserted, so
        nothing is evicted or dumped; each key counts one access (kept in the ghost table while
        away). What the hierarchy fetches with, so DRAM never holds a row twice."""
        k = as_keys(keys)
        rows = np.empty((k.shape[0], self.row_width), dtype=self.dtype)
        with self._lock:
            miss = np.flatnonzero(~self.cache.contains(k))
            if miss.shape[0]:  # first, so that a failing read leaves the cache as it was
                self._count_loads(self._fill_misses(k[miss], rows, miss))
            self.cache.take(k, out=rows)
        return rows

    def push(self, keys, rows, unpin: bool = True) -> None:
        """Write ``rows`` (n, row_width) of ``keys`` (n,) back (dirty; later duplicates win) and,
        with ``unpin``, drop the pin ``pull`` took on each distinct key that holds one. Keys not
        cached are inserted dirty (unpinned), dumping evicted dirty rows to the store first."""
        k = as_keys(keys)
        r = check_rows(rows, k.shape[0], self.row_width, self.dtype, "rows")
        with self._lock:
            if k.shape[0] == 0:
                return
            found = self.cache.update(k, r)
            if not found.all():
                nk, nr = (k, r) if not found.any() else (k[~found], r[~found])  # no copy in the usual case
                uniq, _, inverse = K.unique_counts(nk)
                if uniq.shape[0] < nk.shape[0]:  # duplicates: later ones win
                    last = np.empty(uniq.shape[0], dtype=np.int64)
                    last[inverse] = np.arange(nk.shape[0])
                    nk, nr = uniq, nr[last]
                self._insert(nk, nr, dirty=True, pin=False, freq=1)
            if unpin and found.any():
                fk = k[found]
                pinned = fk[self.cache.pin_counts(fk) > 0]
                if pinned.shape[0]:
                    self.cache.unpin(pinned)

    def read(self, keys) -> np.ndarray:
        """Current rows of ``keys`` (n,) uint64 -> (n, row_width), read only: cached rows, else the
        store's, else the initializer's. Nothing is cached, pinned or counted (evaluation)."""
        k = as_keys(keys)
        with self._lock:
            rows, hit = self.cache.peek(k)
            miss = np.flatnonzero(~hit)
            if miss.shape[0]:
                self._fill_misses(k[miss], rows, miss)
        return rows

    def delete(self, keys) -> int:
        """Delete ``keys`` (n,) uint64 from the cache and the store (a deleted key that comes back
        is born again from the initializer) -> keys the store held. Raises InvalidInputError,
        deleting nothing, when one of them is pinned."""
        k = as_keys(keys)
        with self._lock:
            if k.shape[0] == 0:
                return 0
            self.cache.discard(k)
            return self.store.delete(k)

    def write_through(self, keys, rows) -> None:
        """Make the store hold ``rows`` (n, row_width) of distinct ``keys`` (n,), rows another tier
        holds (the HBM-PS, at a checkpoint): straight to the store, not into the cache, whose content
        stays as it was; a key the cache does hold (pinned while taken) gets its row there, dirty,
        and reaches the store with the next flush or eviction."""
        k = as_keys(keys)
        r = check_rows(rows, k.shape[0], self.row_width, self.dtype, "rows")
        with self._lock:
            if k.shape[0] == 0:
                return
            cached = self.cache.update(k, r)
            if not cached.any():
                self.store.dump(k, r)
            elif not cached.all():
                self.store.dump(k[~cached], r[~cached])
            self._dumped += int((~cached).sum())

    def unpin(self, keys) -> None:
        """Drop one pin per distinct key without writing (e.g. a batch that was abandoned)."""
        with self._lock:
            self.cache.unpin(keys)

    def flush(self) -> int:
        """Dump every dirty cached row to the store (rows stay cached, now clean) -> rows dumped."""
        with self._lock:
            n = self.cache.flush(self.store.dump)
            self._dumped += n
            return n

    def stats(self) -> dict:
        """hits, misses (distinct keys per pull), ssd_loads, new_rows, evicted, dumped, size,
        pinned, dirty, capacity_rows, budget_bytes, hit_rate, per_batch_hit_rate (one per pull)."""
        with self._lock:
            cs = self.cache.stats()
            total = cs.per_batch_hits + cs.per_batch_misses
            per_batch = np.divide(cs.per_batch_hits, total, out=np.zeros(total.shape[0]), where=total > 0)
            return dict(hits=cs.hits, misses=cs.misses, hit_rate=cs.hit_rate, ssd_loads=self._ssd_loads,
                        new_rows=self._new_rows, evicted=cs.evicted, dumped=self._dumped,
                        size=cs.size, pinned=cs.pinned, dirty=cs.dirty, capacity_rows=cs.capacity_rows,
                        budget_bytes=self.cache.budget_bytes, per_batch_hit_rate=per_batch)
