"""``MemPS``: one node's DRAM parameter server — the :class:`RowCache` over an SSD-PS store."""

from __future__ import annotations

import threading

import numpy as np

from .._keys import as_keys, check_rows, rows_at
from ..errors import CacheBudgetError, InternalError, InvalidInputError
from ._cache import DEFAULT_GHOST_FACTOR, DEFAULT_LRU_FRACTION, FLUSH_CHUNK_BYTES, Evicted, RowCache
from ._unique import unique_counts


#: Bytes of an evicted row on its way to the store besides twice its row: its key, dirty flag and
#: frequency in ``Evicted``; the rows are there and, when only some are dirty, in the copy of the
#: dirty ones handed to ``dump`` (with their keys).
EVICTED_ROW_EXTRA = 8 + 1 + 8 + 8


def _flight_bytes(rows: int, row_bytes: int) -> int:
    """Bytes of ``rows`` evicted rows of ``row_bytes`` each on their way to the store: twice the row
    and ``EVICTED_ROW_EXTRA``."""
    return int(rows) * (2 * int(row_bytes) + EVICTED_ROW_EXTRA)


class MemPS:
    """The MEM-PS of one node's shard: a DRAM ``RowCache`` in front of ``store``.

    - ``store``: an object with the ``hps.ssd.SSDStore`` API — ``dump(keys, rows)`` (durable on
      return), ``load_into(keys, out, at) -> found`` (rows read straight into place), and
      ``delete(keys)`` for :meth:`delete` — holding rows of ``row_width`` values of ``dtype``;
      optionally ``index_bytes(n_more)`` and ``index_room()`` (its in-memory index, see
      ``budget_bytes``).
    - ``budget_bytes`` or ``capacity_rows``: the DRAM budget (exactly one). ``budget_bytes`` is the
      DRAM of this tier as a whole: the cache's rows, per-row state, key map and ghost table
      (``RowCache.bytes_for``) *and* the store's in-memory index, which grows with the rows the
      store holds. The cache yields to the index (as RocksDB charges its memtables to the block
      cache): before each write to the store the cache's capacity is set so that both fit, the
      index counted at the peak of its next rebuild (old and new arrays); when that peak doubles,
      after a rebuild, the cache sheds rows into the index's new room (:meth:`set_budget`
      changes the budget).
      ``capacity_rows`` fixes the cache's rows instead and counts nothing else.
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
        self.store = store
        self.row_width = int(row_width)
        self.dtype = np.dtype(dtype)
        self.initializer = initializer
        self._budget = None if budget_bytes is None else int(budget_bytes)
        self._ghost_factor = float(ghost_factor)
        self._row_bytes = self.row_width * self.dtype.itemsize
        if capacity_rows is None:
            capacity_rows = self._rows_within(0)
            if capacity_rows < 1:
                raise InvalidInputError(str(self._too_small(1, 1)))
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

    # ------------------------------------------------------------------ the budget (lock held)
    @staticmethod
    def chunk_rows(budget_bytes: int, row_bytes: int) -> int:
        """Rows a MemPS of ``budget_bytes`` writes to its store at a time: 1/16 of the budget on
        their way there (their rows copied out of the cache, with key, flag and frequency)."""
        return max(1, min(FLUSH_CHUNK_BYTES, int(budget_bytes) // 16) // _flight_bytes(1, row_bytes))

    def _chunk(self) -> int:
        """Rows written to the store at a time with a byte budget (:meth:`chunk_rows`)."""
        return self.chunk_rows(self._budget, self._row_bytes)

    def _store_room(self) -> int:
        """Rows the store takes before its index rebuilds (unbounded for a store that does not say)."""
        room = getattr(self.store, "index_room", None)
        return int(room()) if room is not None else 1 << 62

    def _store_bytes(self, write: int, ahead: bool = True) -> int:
        """The store's in-memory index at its peak while ``write`` rows are written and, ``ahead``,
        through its next rebuild whether they cause it or not (0 for a store that does not say:
        ``index_bytes``/``index_room``)."""
        if getattr(self.store, "index_bytes", None) is None:
            return 0
        return int(self.store.index_bytes(max(self._store_room() + 1, write) if ahead else max(1, write)))

    def _rows_within(self, write: int, ahead: bool = True) -> int:
        """Cache rows that fit the budget beside the store's index (:meth:`_store_bytes`) and beside
        the ``write`` rows on their way to the store (``Evicted`` copies)."""
        room = self._budget - self._store_bytes(write, ahead) - _flight_bytes(write, self._row_bytes)
        return RowCache.rows_for_bytes(room, self.row_width, self.dtype, self._ghost_factor)

    def _fit(self, write: int | None = None, pinning: int = 0) -> None:
        """Before a write of ``write`` rows to the store (default one chunk; evicted ones are in flight
        meanwhile) and of ``pinning`` rows to be pinned: set the cache's capacity so that the cache,
        the rows in flight and the store's index fit the budget and the cache holds its pinned rows
        and the new ones. The cache gives way to the index ahead of its next rebuild (only when it
        holds the pinned rows beside that rebuild; else beside the index as it is): it sheds rows a
        chunk at a time into the room the index has left (the cache shrinks, then the chunk is
        dumped; on failure it grows back and takes the chunk again). After a rebuild that room is
        about half the index, more than the rows to shed (each frees its row, state and maps, more
        than its key costs the index at its next rebuild); when it is used up the rest goes at
        once, counted in flight. When the budget cannot hold the next rebuild at all, the cache
        only makes room for the index as it is and the next chunk (a table that stops growing
        still fits); CacheBudgetError comes when a write needs the rebuild (or the pinned rows do
        not fit). A lowered capacity keeps 1/64 of slack so that the block crcs' small growth does
        not shrink the cache at every write. No-op without a byte budget."""
        if self._budget is None:
            return
        cache, chunk = self.cache, self._chunk()
        write = chunk if write is None else max(int(write), 1)
        need = max(1, cache.n_pinned + int(pinning))
        old = cache.capacity_rows
        while True:   # the index may rebuild meanwhile (a compaction): look again each time
            ahead = self._rows_within(write) >= need
            cap = self._rows_within(write, ahead)
            room = self._store_room()
            if len(cache) <= cap or cap < need:
                break
            step = min(chunk, len(cache) - cap, room)
            if step < 1:   # the index rebuilds on the next write: the rest goes now, in flight meanwhile
                cap = self._rows_within(max(write, len(cache) - cap), ahead)
                step = len(cache) - cap
                if cap < need:
                    break
            ev = cache.evict_to(len(cache) - step)
            cache.set_capacity(max(1, len(cache)))
            self._dump_evicted(ev, regrow=old)
        if cap < need:
            raise self._too_small(need, write, ahead)
        if cap < old:
            cap = max(need, cap - cap // 64)
        if cap != cache.capacity_rows and len(cache) <= cap:
            cache.set_capacity(max(cap, 1))

    def _store_rows(self) -> int | None:
        """Rows the store holds, or None for a store that does not count them (no ``__len__``)."""
        return len(self.store) if hasattr(self.store, "__len__") else None

    def _too_small(self, need: int, write: int, ahead: bool = True) -> CacheBudgetError:
        one = RowCache.bytes_for(need, self.row_width, self.dtype, self._ghost_factor)
        index = self._store_bytes(write, ahead)
        flight = _flight_bytes(write, self._row_bytes)
        held = self._store_rows()
        why = ("at its first rebuild, which this tier keeps room for from its start" if held == 0 else
               "at its next rebuild; it grows with the table, which has outgrown this budget")
        return CacheBudgetError(
            f"a MEM-PS budget of {self._budget:,} B cannot hold {need:,} cache rows ({one:,} B with their state, "
            f"key map and ghost table) beside its store's key index ({index:,} B {why}) and the "
            f"{write:,} rows on their way there ({flight:,} B): raise the budget by at least "
            f"{max(1, one + index + flight - self._budget):,} B")

    def set_budget(self, budget_bytes: int) -> None:
        """Make ``budget_bytes`` this tier's DRAM (see the class docstring): a lower one evicts and
        dumps rows at once; a higher one lets the cache grow. Raises CacheBudgetError, changing
        nothing, when the pinned rows and the store's index do not fit; InvalidInputError on a
        MemPS made with ``capacity_rows``."""
        with self._lock:
            if self._budget is None:
                raise InvalidInputError("set_budget: this MemPS was made with capacity_rows, not budget_bytes")
            old, self._budget = self._budget, int(budget_bytes)
            try:
                self._fit()
            except CacheBudgetError:
                self._budget = old
                raise

    @property
    def budget_bytes(self) -> int | None:
        """The DRAM budget of this tier (cache and store index), or None with ``capacity_rows``."""
        return self._budget

    # ------------------------------------------------------------------ internals (lock held)
    def _dump_evicted(self, ev: Evicted, regrow: int | None = None) -> None:
        """Dump the dirty rows of ``ev``; on failure put all of ``ev`` back (first raising the
        cache's capacity to ``regrow``, when given) and re-raise. REQUIRES: lock held."""
        d = ev.dirty
        if not d.any():
            return
        try:
            if d.all():  # the usual case: no copy of the rows
                self.store.dump(ev.keys, ev.rows)
            else:
                self.store.dump(ev.keys[d], ev.rows[d])
        except BaseException:
            if regrow is not None:
                self.cache.set_capacity(regrow)
            self.cache.restore(ev)
            raise
        self._dumped += int(d.sum())

    def _insert(self, keys, rows, dirty: bool, pin: bool, freq, at=None) -> None:
        """Insert distinct uncached ``keys``: make room (dumping dirty victims), then put. Unpinned
        keys go in chunks of the unpinned room (with a byte budget, of ``_chunk()`` at most, each
        fitted to it first), so a push larger than the budget still lands (its first rows are
        dumped by its later ones). ``at``: the row of ``keys[i]`` is ``rows[at[i]]`` (None: ``rows[i]``).
        REQUIRES: lock held."""
        n = keys.shape[0]
        freq = np.broadcast_to(np.asarray(freq, dtype=np.int64), (n,))
        chunk = n if self._budget is None else self._chunk()
        a = 0
        while a < n:
            if pin:   # pinned rows go at once (so may their victims), and the cache must hold them all
                self._fit(n - a, pinning=n - a)
            else:
                self._fit(min(n - a, chunk))
            b = n if pin else min(n, a + max(1, min(chunk, self.cache.capacity_rows - self.cache.n_pinned)))
            ev = self.cache.make_room(b - a)
            self._dump_evicted(ev)
            if at is None:
                left = self.cache.put(keys[a:b], rows[a:b], dirty=dirty, pin=pin, freq=freq[a:b], absent=True)
            else:
                left = self.cache.put(keys[a:b], rows, dirty=dirty, pin=pin, freq=freq[a:b], at=at[a:b], absent=True)
            if left.keys.shape[0]:  # make_room freed b - a slots: nothing may be evicted here
                raise InternalError(f"MEM-PS: inserting {b - a} rows after making room for them evicted "
                                    f"{left.keys.shape[0]} more")
            a = b

    # ------------------------------------------------------------------ API
    def pull(self, keys) -> np.ndarray:
        """Rows of ``keys`` (n,) uint64 -> (n, row_width) host array, and pin every distinct key.

        Every occurrence counts as an access. Misses come from the store, else from the
        initializer. Raises CacheBudgetError (nothing pinned by this call) when the pinned rows
        would exceed the budget."""
        k = as_keys(keys)
        uniq, counts, inverse = unique_counts(k)
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

    def _fill_misses(self, keys, rows, at, born: bool = True) -> np.ndarray:
        """``rows[at[i]]`` = the row of uncached ``keys[i]``: the store's, read straight into place,
        else (``born``) born there from the initializer -> found in the store (n,) bool. An empty store
        (``len`` 0: a table that has not outgrown the MEM-PS yet, the usual case of a job) is not asked:
        its index probe finds nothing (0.16 s of the 2 M-row ``bench/bench_host.py`` job's 5.7 M misses).
        REQUIRES: lock held."""
        if self._store_rows() == 0:
            found = np.zeros(keys.shape[0], dtype=np.bool_)
        else:
            found = self.store.load_into(keys, rows, at)
        if born and not found.any():   # the usual case: no copy of the keys and places
            self.initializer.fill(keys, rows, at)
        elif born and not found.all():
            self.initializer.fill(keys[~found], rows, at[~found])
        return found

    def _count_loads(self, found) -> None:
        n_found = int(found.sum())
        self._ssd_loads += n_found
        self._new_rows += found.shape[0] - n_found

    def take(self, keys, out=None, at=None, leave_born: bool = False):
        """Rows of distinct ``keys`` (n,) uint64 moved out to the caller (the HBM-PS), which holds them
        from now on and ``push``-es them back when done -> ``out``, the row of ``keys[i]`` in
        ``out[at[i]]`` (``out`` (m, row_width) of the dtype, C order, default a new (n, row_width)
        array; ``at`` (n,) int64, default 0..n-1: the CPU twin of the HBM-PS passes its slot array
        and the slots its keys claimed, so the rows land in place). Cached rows leave the cache
        without a dump (a pinned one stays), the others are read from the store straight into
        place, else born from the initializer there. Nothing is inserted, so nothing is evicted or
        dumped; each key counts one access (kept in the ghost table while away). What the hierarchy
        fetches with, so DRAM never holds a row twice. A failing read leaves the cache as it was
        (rows of ``out`` at ``at`` may have been written).

        ``leave_born``: keys neither cached nor stored keep their rows unwritten, for the caller to
        make with :attr:`initializer`'s rule where they go (a GPU HBM-PS births them on the device);
        returns ``(out, born)``, born (n,) bool marking them."""
        k = as_keys(keys)
        rows, at = rows_at(out, at, k.shape[0], self.row_width, self.dtype)
        born = np.zeros(k.shape[0], np.bool_) if leave_born else None
        with self._lock:
            slots = self.cache._find_unchecked(k)   # each key probed once: the take below reuses them
            miss = np.flatnonzero(slots < 0)
            if miss.shape[0] == k.shape[0]:  # every key (a first batch, an empty cache): no copy
                found = self._fill_misses(k, rows, at, not leave_born)
                if leave_born:
                    np.logical_not(found, out=born)
                self._count_loads(found)
            elif miss.shape[0]:  # first, so that a failing read leaves the cache as it was
                found = self._fill_misses(k[miss], rows, at[miss], not leave_born)
                if leave_born:
                    born[miss[~found]] = True
                self._count_loads(found)
            self.cache._take_unchecked(k, rows, at, slots)  # validated above (rows_at); nothing cached since
        return (rows, born) if leave_born else rows

    def push(self, keys, rows, unpin: bool = True, distinct: bool = False, at=None, absent: bool = False) -> None:
        """Write ``rows`` (n, row_width) of ``keys`` (n,) back (dirty; later duplicates win) and,
        with ``unpin``, drop the pin ``pull`` took on each distinct key that holds one. Keys not
        cached are inserted dirty (unpinned), dumping evicted dirty rows to the store first.
        ``distinct``: no key repeats (rows evicted from the HBM-PS): no dedup (a repeated key: a bug).
        ``absent`` (with ``distinct``, without ``unpin``): none is cached either (owned rows leaving the
        HBM-PS: exclusive tiers): no lookup first. A key cached after all is assigned (its row lands).
        ``at`` (n,) int64: the row of ``keys[i]`` is ``rows[at[i]]`` of ``rows`` (m, row_width) C order,
        read in place (the CPU twin's slot array and its victims' slots: no gather)."""
        k = as_keys(keys)
        if at is None:
            r = check_rows(rows, k.shape[0], self.row_width, self.dtype, "rows")
        else:
            r, at = rows_at(rows, at, k.shape[0], self.row_width, self.dtype)
        if absent and (unpin or not distinct):
            raise InvalidInputError("MemPS.push: absent=True needs distinct=True and unpin=False")
        with self._lock:
            if k.shape[0] == 0:
                return
            found = np.zeros(k.shape[0], np.bool_) if absent else self.cache.update(k, r, at)
            if not found.all():
                sel = None if not found.any() else np.flatnonzero(~found)  # no copy in the usual case
                nk = k if sel is None else k[sel]
                if not distinct:
                    uniq, _, inverse = unique_counts(nk)
                    if uniq.shape[0] < nk.shape[0]:  # later duplicates win
                        last = np.empty(uniq.shape[0], dtype=np.int64)
                        last[inverse] = np.arange(nk.shape[0])
                        sel = last if sel is None else sel[last]
                        nk = uniq   # = nk[last]: each key once
                if at is None:
                    self._insert(nk, r if sel is None else r[sel], dirty=True, pin=False, freq=1)
                else:
                    self._insert(nk, r, dirty=True, pin=False, freq=1, at=at if sel is None else at[sel])
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
        """Delete ``keys`` (n,) uint64 from the store, then the cache (a deleted key that comes back is
        born again from the initializer; a store that fails leaves the newer cached rows) -> keys the
        store held. Raises InvalidInputError, deleting nothing, when one of them is pinned."""
        k = as_keys(keys)
        with self._lock:
            if (self.cache.pin_counts(k) > 0).any():   # pins change only under this lock
                raise InvalidInputError("delete: pinned keys cannot be removed (unpin them first)")
            n = self.store.delete(k)
            self.cache.discard(k)
            return n

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
                self._dump_fitted(k, r)
            elif not cached.all():
                self._dump_fitted(k[~cached], r[~cached])
            self._dumped += int((~cached).sum())

    def _dump_fitted(self, keys, rows) -> None:
        """Dump rows to the store, with a byte budget a chunk at a time, each fitted to it first
        (the cache holds none of them). REQUIRES: lock held."""
        step = keys.shape[0] if self._budget is None else self._chunk()
        for a in range(0, keys.shape[0], step):
            self._fit(min(step, keys.shape[0] - a))
            self.store.dump(keys[a:a + step], rows[a:a + step])

    def unpin(self, keys) -> None:
        """Drop one pin per distinct key without writing (e.g. a batch that was abandoned)."""
        with self._lock:
            self.cache.unpin(keys)

    def flush(self) -> int:
        """Dump every dirty cached row to the store (rows stay cached, now clean) -> rows dumped."""
        with self._lock:
            if self._budget is None:
                n = self.cache.flush(self.store.dump)
            else:   # a chunk at a time, each fitted to the budget first (the index grows with them)
                n = self.cache.flush(self.store.dump, self._chunk() * self._row_bytes, before=self._fit)
            self._dumped += n
            return n

    def rows_after_flush(self, held) -> int:
        """The distinct keys the store would hold if the rows of ``held`` (n,) uint64 keys (another
        tier's: the HBM-PS's) were pushed and the cache flushed, with nothing written: its live keys,
        the dirty cached keys and ``held`` it lacks (one probe of its ``contains``, and ``len``)."""
        k = as_keys(held)
        with self._lock:
            extra, _, _ = unique_counts(np.concatenate([self.cache.dirty_rows(rows=False)[0], k]))
            return len(self.store) + int(np.count_nonzero(~self.store.contains(extra)))

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
