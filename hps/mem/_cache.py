"""``RowCache``: the MEM-PS DRAM cache of fixed-width parameter rows (Appendix D of the paper).

Policy: every visited row enters the LRU part; rows pushed out of the LRU part (it holds at most
``lru_fraction`` of the capacity) enter the LFU part, ordered by frequency (exact below 64, then
by powers of two) and, among equals, by arrival in the LFU part (O(1) per operation); a row
evicted from the LFU part (or from the LRU tail when the LFU part is empty) leaves the cache and is
handed back to the caller with its dirty flag, to be dumped to SSD. Pinned rows (the working set of
the current and prefetched batches) sit in neither part and are never evicted.

Policies as settings: ``lru_fraction=1`` is plain LRU, ``lru_fraction=0`` is plain LFU (frequency
counted while cached), anything between is the paper's LRU+LFU.
"""

from __future__ import annotations

import threading

import numpy as np

from .._keys import EMPTY_KEY, as_keys, check_rows
from ..errors import CacheBudgetError, InvalidInputError
from . import _cache_kernels as K
from ._cache_types import (DEFAULT_GHOST_FACTOR, DEFAULT_LRU_FRACTION, CacheStats, Evicted, cache_bytes,
                           cache_rows_for_bytes, pow2_at_least)

#: Bytes of rows handed to one ``dump`` call by :meth:`RowCache.flush`.
FLUSH_CHUNK_BYTES = 64 << 20


class RowCache:
    """A DRAM cache of ``capacity_rows`` rows of ``row_width`` values of ``dtype`` (host NumPy).

    - ``capacity_rows``: budget in rows (bytes = rows * row_width * itemsize).
    - ``lru_fraction``: share of the capacity for the LRU part (default ``DEFAULT_LRU_FRACTION``).
    - ``ghost_factor``: remember the frequency of evicted keys in a direct-mapped table of
      ``ghost_factor * capacity_rows`` cells (rounded up to a power of two; 16 bytes each); a
      returning key resumes its count (default ``DEFAULT_GHOST_FACTOR``; 0 disables).

    Every method takes a batch of keys (n,) uint64 (int64 reinterpreted; the all-ones key is
    rejected) and blocks until done. Thread-safe: each method holds the cache's lock for its whole
    call (the kernels release the GIL, so other threads run meanwhile).
    """

    def __init__(self, capacity_rows: int, row_width: int, dtype=np.float32,
                 lru_fraction: float = DEFAULT_LRU_FRACTION, ghost_factor: float = DEFAULT_GHOST_FACTOR):
        capacity_rows = int(capacity_rows)
        row_width = int(row_width)
        if capacity_rows < 1:
            raise InvalidInputError(f"capacity_rows must be >= 1, got {capacity_rows}")
        if row_width < 1:
            raise InvalidInputError(f"row_width must be >= 1, got {row_width}")
        if not 0.0 <= lru_fraction <= 1.0:
            raise InvalidInputError(f"lru_fraction must be in [0, 1], got {lru_fraction}")
        if ghost_factor < 0:
            raise InvalidInputError(f"ghost_factor must be >= 0, got {ghost_factor}")
        self.capacity_rows = capacity_rows
        self.row_width = row_width
        self.dtype = np.dtype(dtype)
        self.lru_fraction = float(lru_fraction)
        self.ghost_factor = float(ghost_factor)
        self.lock = threading.RLock()
        c = capacity_rows
        self._st = np.zeros(K.N_STATE, dtype=np.int64)
        self._st[K.ST_LRU_TARGET] = int(round(self.lru_fraction * c))
        self._st[K.ST_FREE_TOP] = c
        self._skey = np.full(c, EMPTY_KEY, dtype=np.uint64)
        self._rows = np.zeros((c, row_width), dtype=self.dtype)
        self._dirty = np.zeros(c, dtype=np.bool_)
        self._pins = np.zeros(c, dtype=np.int32)
        self._freq = np.zeros(c, dtype=np.int64)
        self._where = np.zeros(c, dtype=np.int8)
        self._stamp = np.zeros(c, dtype=np.int64)
        self._prev = np.full(c, -1, dtype=np.int32)
        self._nxt = np.full(c, -1, dtype=np.int32)
        self._bkt = np.zeros(c, dtype=np.int32)
        self._bhead = np.full(K.N_BUCKETS + 1, -1, dtype=np.int32)   # the LFU classes, then the LRU part
        self._btail = np.full(K.N_BUCKETS + 1, -1, dtype=np.int32)
        self._free = np.arange(c - 1, -1, -1, dtype=np.int32)  # slot 0 is taken first
        self._mkeys = np.full(pow2_at_least(2 * c), EMPTY_KEY, dtype=np.uint64)
        self._mvals = np.zeros(self._mkeys.shape[0], dtype=np.int32)
        g = int(round(self.ghost_factor * c))
        g = pow2_at_least(g) if g else 0
        self._ghost = np.zeros((g, 2), dtype=np.uint64)  # (key, freq) per cell
        self._ghost[:, 0] = EMPTY_KEY
        self._hits = 0
        self._misses = 0
        self._inserted = 0
        self._evicted = 0
        self._evicted_dirty = 0
        self._batch_hits: list[int] = []
        self._batch_misses: list[int] = []
        self._visit_buf = None   # scratch arrays of visit_batch

    bytes_for = staticmethod(cache_bytes)            # DRAM a cache of these settings allocates
    rows_for_bytes = staticmethod(cache_rows_for_bytes)  # the largest capacity that fits in n bytes

    # ------------------------------------------------------------------ introspection
    @property
    def nbytes(self) -> int:
        """DRAM this cache's arrays hold (rows, state, key map, ghost table)."""
        arrays = (self._st, self._skey, self._rows, self._dirty, self._pins, self._freq, self._where,
                  self._stamp, self._prev, self._nxt, self._bkt, self._bhead, self._btail, self._free,
                  self._mkeys, self._mvals, self._ghost)
        return sum(a.nbytes for a in arrays)

    @property
    def budget_bytes(self) -> int:
        """Bytes of the cached rows (capacity_rows * row_width * itemsize); the ghost table is extra."""
        return self.capacity_rows * self.row_width * self.dtype.itemsize

    @property
    def ghost_bytes(self) -> int:
        """Bytes of the ghost frequency table, held beside the rows and not part of ``budget_bytes``."""
        return self._ghost.nbytes

    def __len__(self) -> int:
        return self.capacity_rows - int(self._st[K.ST_FREE_TOP])

    @property
    def n_pinned(self) -> int:
        return int(self._st[K.ST_N_PINNED])

    def contains(self, keys) -> np.ndarray:
        """(n,) bool: which keys are cached. No access is counted."""
        k = as_keys(keys)
        found = np.empty(k.shape[0], dtype=np.bool_)
        with self.lock:
            if k.shape[0]:
                K.contains(self._mkeys, self._mvals, k, found)
        return found

    def peek(self, keys):
        """(rows (n, W), found (n,) bool) of cached keys without counting an access; zeros where absent."""
        k = as_keys(keys)
        out = np.zeros((k.shape[0], self.row_width), dtype=self.dtype)
        found = np.empty(k.shape[0], dtype=np.bool_)
        with self.lock:
            if k.shape[0]:
                K.gather(self._rows, self._mkeys, self._mvals, k, out, found)
        return out, found

    def pin_counts(self, keys) -> np.ndarray:
        """(n,) int32 pin count of each key (0 when not cached). No access is counted."""
        k = as_keys(keys)
        out = np.zeros(k.shape[0], dtype=np.int32)
        with self.lock:
            if k.shape[0]:
                K.pin_counts(self._pins, self._mkeys, self._mvals, k, out)
        return out

    def stats(self) -> CacheStats:
        with self.lock:
            return CacheStats(
                capacity_rows=self.capacity_rows, size=len(self), pinned=self.n_pinned,
                dirty=int(K.dirty_slots(self._dirty, self._where).shape[0]),
                hits=self._hits, misses=self._misses, inserted=self._inserted,
                evicted=self._evicted, evicted_dirty=self._evicted_dirty,
                per_batch_hits=np.array(self._batch_hits, dtype=np.int64),
                per_batch_misses=np.array(self._batch_misses, dtype=np.int64),
            )

    # ------------------------------------------------------------------ operations
    def lookup(self, keys, pin: bool = True, counts=None):
        """Look ``keys`` up: -> (rows (n, W), hit (n,) bool); rows of misses are zeros.

        Each occurrence of a cached key counts as one access (``counts[i]`` accesses when given);
        every distinct hit is pinned once (``pin``) or moved to the LRU's recent end. Misses change
        nothing: pass their counts to :meth:`put` as ``freq``. With ``counts`` given the keys
        should be distinct (hit/miss counters are per distinct key). One batch of the per-batch
        hit counters per call."""
        k = as_keys(keys)
        n = k.shape[0]
        inverse = None
        if counts is None:
            k, c, inverse = K.unique_counts(k)
        else:
            c = np.ascontiguousarray(counts, dtype=np.int64)
            if c.shape != (n,):
                raise InvalidInputError(f"counts must have shape ({n},), got {c.shape}")
        out = np.zeros((k.shape[0], self.row_width), dtype=self.dtype)
        hit = np.zeros(k.shape[0], dtype=np.bool_)
        with self.lock:
            n_hit = 0
            if k.shape[0]:
                n_hit = self._lookup_kernel(k, c, bool(pin), out, hit)
            n_miss = k.shape[0] - n_hit if inverse is not None else int(n - hit.sum())
            self._hits += n_hit
            self._misses += n_miss
            self._batch_hits.append(n_hit)
            self._batch_misses.append(n_miss)
        if inverse is not None:
            return out[inverse], hit[inverse]
        return out, hit

    def visit_batch(self, keys, counts) -> int:
        """One batch as :func:`hps.mem.replay` plays it: ``lookup(keys, pin=True, counts=counts)``,
        ``put`` of the misses (zero rows, clean, pinned, ``freq`` = their counts), ``unpin(keys)``.
        The same kernels in the same order, so the same decisions, minus the per-call host work
        (buffers are reused). ``keys`` distinct (n,) uint64, ``counts`` (n,) int64. -> hits.
        Raises CacheBudgetError, with the hits left pinned, when the batch does not fit."""
        k = as_keys(keys)
        c = np.ascontiguousarray(counts, dtype=np.int64)
        n = k.shape[0]
        if c.shape != (n,):
            raise InvalidInputError(f"counts must have shape ({n},), got {c.shape}")
        with self.lock:
            buf = self._visit_buffers(n)
            hit = buf["hit"][:n]
            n_hit = self._lookup_kernel(k, c, True, buf["out"][:n], hit)
            self._hits += n_hit
            self._misses += n - n_hit
            self._batch_hits.append(n_hit)
            self._batch_misses.append(n - n_hit)
            miss = np.flatnonzero(~hit)
            m = miss.shape[0]
            if self.n_pinned + m > self.capacity_rows:
                raise self._budget_error(self.n_pinned + m)
            ev = buf["ev"]
            n_ev = self._put_kernel(k[miss], buf["zeros"][:m], buf["clean"][:m], c[miss], True, ev)
            self._inserted += m
            self._account(ev, n_ev)
            self._unpin_kernel(k)
            return n_hit

    def _visit_buffers(self, n: int) -> dict:
        """Scratch arrays of ``visit_batch`` for n keys (grown by doubling). REQUIRES: lock held."""
        buf = self._visit_buf
        if buf is None or buf["hit"].shape[0] < n:
            m = max(n, 1024, 2 * (0 if buf is None else buf["hit"].shape[0]))
            buf = self._visit_buf = dict(
                hit=np.zeros(m, dtype=np.bool_), clean=np.zeros(m, dtype=np.bool_),
                out=np.zeros((m, self.row_width), dtype=self.dtype),
                zeros=np.zeros((m, self.row_width), dtype=self.dtype), ev=self._empty_evicted(m))
        return buf

    # the operation kernels over this cache's state (REQUIRES: lock held, inputs validated)
    def _lookup_kernel(self, k, c, pin: bool, out, hit) -> int:
        return K.lookup(self._st, self._skey, self._rows, self._pins, self._freq, self._where, self._stamp,
                        self._prev, self._nxt, self._bkt, self._bhead, self._btail, self._mkeys, self._mvals,
                        k, c, pin, out, hit)

    def _put_kernel(self, k, r, d, f, pin: bool, ev: Evicted) -> int:
        return K.put(self._st, self._skey, self._rows, self._dirty, self._pins, self._freq, self._where,
                     self._stamp, self._prev, self._nxt, self._bkt, self._bhead, self._btail, self._free,
                     self._mkeys, self._mvals, self._ghost, k, r, d, f, pin, ev.keys, ev.rows, ev.dirty, ev.freq)

    def _unpin_kernel(self, k) -> int:
        return K.unpin(self._st, self._pins, self._freq, self._where, self._stamp, self._prev, self._nxt,
                       self._bkt, self._bhead, self._btail, self._mkeys, self._mvals, k)

    def _budget_error(self, working_set: int) -> CacheBudgetError:
        row_bytes = self.row_width * self.dtype.itemsize
        return CacheBudgetError(
            f"pinned working set of {working_set} rows ({working_set * row_bytes} bytes) exceeds the "
            f"DRAM cache budget of {self.capacity_rows} rows ({self.budget_bytes} bytes, "
            f"{row_bytes} bytes per row); raise the budget or pin fewer rows at once (smaller batches)"
        )

    def _empty_evicted(self, n: int) -> Evicted:
        return Evicted(np.empty(n, dtype=np.uint64), np.empty((n, self.row_width), dtype=self.dtype),
                       np.empty(n, dtype=np.bool_), np.empty(n, dtype=np.int64))

    def _account(self, ev: Evicted, n_ev: int) -> Evicted:
        ev = Evicted(ev.keys[:n_ev], ev.rows[:n_ev], ev.dirty[:n_ev], ev.freq[:n_ev])
        self._evicted += n_ev
        self._evicted_dirty += int(ev.dirty.sum())
        return ev

    def put(self, keys, rows, dirty=False, pin: bool = False, freq=None) -> Evicted:
        """Insert or assign rows, evicting as needed; -> the evicted rows (dump the dirty ones).

        keys (n,), rows (n, W), dirty bool or (n,) bool (OR-ed into a cached row's flag), freq int or
        (n,) int64 accesses to add (default 1 each). Later duplicates win. With ``pin`` every
        distinct key gets one pin. Raises CacheBudgetError, leaving the cache unchanged, when the
        call cannot fit: with ``pin``, rows pinned afterwards > capacity; without, pinned rows +
        new rows > capacity."""
        k = as_keys(keys)
        n = k.shape[0]
        r = check_rows(rows, n, self.row_width, self.dtype, "rows")
        # writable C arrays, always: a read-only view would be a second Numba specialisation of put,
        # compiled mid-run the first time a caller happens to pass one
        d = np.require(np.broadcast_to(np.asarray(dirty, dtype=np.bool_), (n,)), requirements=("C", "W"))
        f = np.asarray(1 if freq is None else freq, dtype=np.int64)
        f = np.require(np.broadcast_to(f, (n,)), requirements=("C", "W"))
        with self.lock:
            if n == 0:
                return self._empty_evicted(0)
            n_new, ws = K.put_check(self._st, self._pins, self._stamp, self._mkeys, self._mvals, k, bool(pin))
            if ws > self.capacity_rows and (pin or n_new > 0):
                raise self._budget_error(int(ws))
            # Room for n victims, not n_new: without pins a call can evict its own earlier keys
            # and insert them again.
            ev = self._empty_evicted(n)
            n_ev = self._put_kernel(k, r, d, f, bool(pin), ev)
            self._inserted += int(n_new)
            return self._account(ev, n_ev)

    def make_room(self, n_free: int) -> Evicted:
        """Evict until ``n_free`` slots are free; -> the evicted rows. The caller owns them now: dump
        the dirty ones, or :meth:`restore` them if the dump fails. Raises CacheBudgetError when
        ``n_free`` + pinned rows > capacity."""
        n_free = int(n_free)
        with self.lock:
            need = n_free - int(self._st[K.ST_FREE_TOP])
            if need <= 0:
                return self._empty_evicted(0)
            if n_free + self.n_pinned > self.capacity_rows:
                raise self._budget_error(n_free + self.n_pinned)
            ev = self._empty_evicted(need)
            n_ev = K.make_room(self._st, self._skey, self._rows, self._dirty, self._freq,
                               self._where, self._prev, self._nxt, self._bkt, self._bhead, self._btail, self._free,
                               self._mkeys, self._mvals, self._ghost, n_free,
                               ev.keys, ev.rows, ev.dirty, ev.freq)
            return self._account(ev, n_ev)

    def restore(self, ev: Evicted) -> None:
        """Put rows from :meth:`make_room` back, unpinned, with their dirty flags and frequencies
        (e.g. after a failed dump). REQUIRES: the slots they left are still free."""
        with self.lock:
            if len(self) + ev.keys.shape[0] > self.capacity_rows:
                raise self._budget_error(len(self) + ev.keys.shape[0])
            self.put(ev.keys, ev.rows, dirty=ev.dirty, pin=False, freq=ev.freq)
            self._inserted -= ev.keys.shape[0]
            self._evicted -= ev.keys.shape[0]
            self._evicted_dirty -= int(ev.dirty.sum())

    def update(self, keys, rows) -> np.ndarray:
        """Assign rows of cached keys and mark them dirty (not an access) -> found (n,) bool.
        Keys not cached are left out (found False)."""
        k = as_keys(keys)
        r = check_rows(rows, k.shape[0], self.row_width, self.dtype, "rows")
        found = np.empty(k.shape[0], dtype=np.bool_)
        with self.lock:
            if k.shape[0]:
                K.update(self._rows, self._dirty, self._mkeys, self._mvals, k, r, found)
        return found

    def discard(self, keys) -> int:
        """Remove cached ``keys`` (n,) uint64 for good, dirty or not: their rows are dropped, not
        handed back (the keys were deleted). Absent keys are skipped -> keys removed. Raises
        InvalidInputError, removing nothing, when one of them is pinned."""
        k = as_keys(keys)
        with self.lock:
            if k.shape[0] == 0:
                return 0
            if (self.pin_counts(k) > 0).any():
                raise InvalidInputError("discard: pinned keys cannot be removed (unpin them first)")
            uk = K.unique_counts(k)[0]
            return int(K.discard(self._st, self._skey, self._dirty, self._pins, self._freq, self._where,
                                 self._prev, self._nxt, self._bkt, self._bhead, self._btail, self._free,
                                 self._mkeys, self._mvals, self._ghost, uk))

    def unpin(self, keys) -> None:
        """Drop one pin of each distinct key; rows reaching zero pins enter the LRU's recent end (and become
        evictable). Raises InvalidInputError, after unpinning the others, for keys not pinned."""
        k = as_keys(keys)
        with self.lock:
            if k.shape[0] == 0:
                return
            bad = self._unpin_kernel(k)
        if bad:
            raise InvalidInputError(f"unpin: {bad} of the keys were not pinned (or not cached)")

    def take(self, keys, out=None):
        """Move the rows of distinct ``keys`` (n,) uint64 out to another tier: -> (rows (n, W), hit
        (n,) bool), rows of misses left as they were in ``out`` (an (n, W) array to fill; default
        new, with undefined rows at misses). Hit rows leave the cache unless pinned, dirty or not,
        without being dumped (the caller now holds their current rows and puts them back, dirty,
        when done); each key's access (one per key) goes to its frequency, for a miss to the ghost
        table, so it counts when the key comes back. Counts hits and misses like :meth:`lookup`.
        Nothing is inserted, so nothing is evicted."""
        k = as_keys(keys)
        n = k.shape[0]
        if out is None:
            out = np.empty((n, self.row_width), dtype=self.dtype)
        elif out.shape != (n, self.row_width) or out.dtype != self.dtype:
            raise InvalidInputError(f"out must be ({n}, {self.row_width}) {self.dtype}, got {out.shape} {out.dtype}")
        hit = np.zeros(n, dtype=np.bool_)
        with self.lock:
            n_hit = 0
            if n:
                n_hit = int(K.take(self._st, self._skey, self._rows, self._dirty, self._pins, self._freq,
                                   self._where, self._prev, self._nxt, self._bkt, self._bhead, self._btail,
                                   self._free, self._mkeys, self._mvals, self._ghost, k, out, hit))
            self._hits += n_hit
            self._misses += n - n_hit
            self._batch_hits.append(n_hit)
            self._batch_misses.append(n - n_hit)
        return out, hit

    def dirty_rows(self):
        """(keys (m,) uint64, rows (m, W)) copies of every dirty cached row, in slot order."""
        with self.lock:
            s = K.dirty_slots(self._dirty, self._where)
            return self._skey[s], self._rows[s]

    def mark_clean(self, keys) -> None:
        """Clear the dirty flag of cached ``keys`` (after their rows reached the store)."""
        k = as_keys(keys)
        with self.lock:
            if k.shape[0]:
                K.mark_clean(self._dirty, self._mkeys, self._mvals, k)

    def flush(self, dump, chunk_bytes: int = FLUSH_CHUNK_BYTES) -> int:
        """Dump every dirty row with ``dump(keys, rows)``, ``chunk_bytes`` of rows per call (memory
        stays bounded however large the cache), marking each chunk clean once its dump returned;
        -> rows dumped. If a dump raises, its chunk and the rest stay dirty."""
        with self.lock:
            slots = K.dirty_slots(self._dirty, self._where)
            step = max(1, int(chunk_bytes) // max(1, self.row_width * self.dtype.itemsize))
            for a in range(0, slots.shape[0], step):  # O(dirty bytes / chunk_bytes) calls
                s = slots[a:a + step]
                keys = self._skey[s]
                dump(keys, self._rows[s])
                self.mark_clean(keys)
            return int(slots.shape[0])

    def evict_all(self) -> Evicted:
        """Evict every unpinned row (e.g. on shutdown); -> the evicted rows."""
        with self.lock:
            return self.make_room(self.capacity_rows - self.n_pinned)
