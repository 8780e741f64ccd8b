"""``RowCache``: the MEM-PS DRAM cache of fixed-width parameter rows (Appendix D of the paper).

Policy: every visited row enters the LRU part; rows pushed out of the LRU part (it holds at most
``lru_fraction`` of the capacity) enter the LFU part, ordered by frequency (exact below 64, then
by powers of two) and, among equals, by arrival in the LFU part (O(1) per operation); a row
evicted from the LFU part (or from the LRU tail when the LFU part is empty) leaves the cache and is
handed back to the caller with its dirty flag, to be dumped to SSD. Pinned rows (the working set of
the current and prefetched batches) sit in neither part and are never evicted.

Policies as settings: ``lru_fraction=1`` is plain LRU, ``lru_fraction=0`` is plain LFU (frequency
counted while cached), anything between is the paper's LRU+LFU.

Memory follows the rows, not the capacity: the arrays (``_slots.CacheSlots``) start small and
double as rows arrive, up to ``capacity_rows``, so a large budget over a small table costs the
table; growing changes no decision (rows are evicted only at the capacity, from the same slots).
:meth:`RowCache.set_capacity` lowers the capacity and gives the memory back.
"""

from __future__ import annotations

import threading

import numpy as np

from .._keys import as_keys, check_rows, rows_at
from .._prefetch import ahead_ring
from ..errors import CacheBudgetError, InvalidInputError
from . import _cache_kernels as K
from . import _map_kernels as M
from . import _policy_kernels as P
from ._records import CacheCounters, CacheStats, Evicted
from ._slots import INITIAL_SLOTS, NO_AT, CacheSlots, rows_for_bytes, slots_bytes
from ._unique import unique_counts

#: Default share of the capacity given to the LRU part (the rest is the LFU part). Measured with
#: ``bench/bench_cache.py`` (Zipf, 200 k keys, fraction of Belady; ghost_factor 4):
#: lru_fraction 0.05 / 0.01 / 0.0 -> alpha 0.8 cache 2 %: 0.749 / 0.782 / 0.789;
#: alpha 1.0 cache 10 %: 0.879 / 0.880 / 0.880; alpha 1.0 cache 2 %: 0.828 / 0.838 / 0.840.
DEFAULT_LRU_FRACTION = 0.01
#: Default ghost table, in multiples of the capacity (16 bytes a cell). Same sweep, alpha 1.0 cache
#: 10 %, lru_fraction 0.05: ghost 0 / 1 / 2 / 4 -> 0.855 / 0.873 / 0.876 / 0.879 of Belady.
DEFAULT_GHOST_FACTOR = 4.0


#: Bytes of rows handed to one ``dump`` call by :meth:`RowCache.flush`.
FLUSH_CHUNK_BYTES = 64 << 20


class RowCache:
    """A DRAM cache of ``capacity_rows`` rows of ``row_width`` values of ``dtype`` (host NumPy).

    - ``capacity_rows``: the most rows it holds (its DRAM at that size: :meth:`bytes_for`; below it,
      :attr:`nbytes` follows the rows held, see the module docstring).
    - ``lru_fraction``: share of the capacity for the LRU part (default ``DEFAULT_LRU_FRACTION``).
    - ``ghost_factor``: remember the frequency of evicted keys in a direct-mapped table of
      ``ghost_factor`` x slots cells (rounded up to a power of two; 16 bytes each; it grows with the
      slots, keeping what it remembers); a returning key resumes its count (default
      ``DEFAULT_GHOST_FACTOR``; 0 disables).

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
        self._s = CacheSlots(min(capacity_rows, INITIAL_SLOTS), row_width, self.dtype, self.ghost_factor,
                             limit=capacity_rows)
        self._s.st[P.ST_LRU_TARGET] = int(round(self.lru_fraction * capacity_rows))
        self._n = CacheCounters()
        self._visit_buf = None   # scratch arrays of visit_batch

    @staticmethod
    def bytes_for(capacity_rows: int, row_width: int, dtype=np.float32,
                  ghost_factor: float = DEFAULT_GHOST_FACTOR) -> int:
        """DRAM a cache of these settings holds at its capacity: rows, per-slot state, key map and
        ghost table (what :attr:`nbytes` reports once it holds ``capacity_rows`` rows)."""
        return slots_bytes(capacity_rows, int(row_width) * np.dtype(dtype).itemsize, ghost_factor)

    @staticmethod
    def rows_for_bytes(n_bytes: int, row_width: int, dtype=np.float32,
                       ghost_factor: float = DEFAULT_GHOST_FACTOR) -> int:
        """The largest capacity (rows) whose :meth:`bytes_for` fits in ``n_bytes`` (0 if none)."""
        return rows_for_bytes(n_bytes, int(row_width) * np.dtype(dtype).itemsize, ghost_factor)

    # ------------------------------------------------------------------ introspection
    @property
    def nbytes(self) -> int:
        """DRAM this cache's arrays hold now (rows, state, key map, ghost table): at most
        ``bytes_for(capacity_rows, ...)``, less while it holds fewer rows."""
        return self._s.nbytes

    @property
    def budget_bytes(self) -> int:
        """Bytes of the cached rows (capacity_rows * row_width * itemsize); the ghost table is extra."""
        return self.capacity_rows * self.row_width * self.dtype.itemsize

    @property
    def ghost_bytes(self) -> int:
        """Bytes of the ghost frequency table, held beside the rows and not part of ``budget_bytes``."""
        return self._s.ghost.nbytes

    def __len__(self) -> int:
        return self._s.n - self._s.n_free

    @property
    def n_pinned(self) -> int:
        return int(self._s.st[P.ST_N_PINNED])

    def contains(self, keys) -> np.ndarray:
        """(n,) bool: which keys are cached. No access is counted."""
        return self._find_unchecked(as_keys(keys)) >= 0

    def _find_unchecked(self, k) -> np.ndarray:
        """(n,) int64 slot of each of the validated keys ``k`` that is cached, -1 elsewhere (no access
        is counted): what :meth:`_take_unchecked` takes, so its keys are probed once. Thread-safe."""
        slots = np.empty(k.shape[0], dtype=np.int64)
        with self.lock:
            if k.shape[0]:
                M.find(self._s.mkeys, self._s.mvals, k, ahead_ring(), slots)
        return slots

    def peek(self, keys):
        """(rows (n, W), found (n,) bool) of cached keys without counting an access; zeros where absent."""
        k = as_keys(keys)
        out = np.zeros((k.shape[0], self.row_width), dtype=self.dtype)
        found = np.empty(k.shape[0], dtype=np.bool_)
        with self.lock:
            if k.shape[0]:
                M.gather(self._s.rows, self._s.mkeys, self._s.mvals, k, out, found)
        return out, found

    def pin_counts(self, keys) -> np.ndarray:
        """(n,) int32 pin count of each key (0 when not cached). No access is counted."""
        k = as_keys(keys)
        out = np.zeros(k.shape[0], dtype=np.int32)
        with self.lock:
            if k.shape[0]:
                M.pin_counts(self._s.pins, self._s.mkeys, self._s.mvals, k, out)
        return out

    def stats(self) -> CacheStats:
        with self.lock:
            return self._n.stats(self.capacity_rows, len(self), self.n_pinned,
                                 int(K.dirty_slots(self._s.dirty, self._s.where).shape[0]))

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
            k, c, inverse = unique_counts(k)
        else:
            c = np.ascontiguousarray(counts, dtype=np.int64)
            if c.shape != (n,):
                raise InvalidInputError(f"counts must have shape ({n},), got {c.shape}")
        out = np.zeros((k.shape[0], self.row_width), dtype=self.dtype)
        hit = np.zeros(k.shape[0], dtype=np.bool_)
        with self.lock:
            n_hit = 0
            if k.shape[0]:
                n_hit = self._s.lookup(k, c, bool(pin), out, hit)
            n_miss = k.shape[0] - n_hit if inverse is not None else int(n - hit.sum())
            self._n.batch(n_hit, n_miss)
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
            n_hit = self._s.lookup(k, c, True, buf["out"][:n], hit)
            self._n.batch(n_hit, n - n_hit)
            miss = np.flatnonzero(~hit)
            m = miss.shape[0]
            if self.n_pinned + m > self.capacity_rows:
                raise self._budget_error(self.n_pinned + m)
            self._grow_for(m)
            ev = buf["ev"]
            n_ev = self._s.put(k[miss], buf["zeros"][:m], buf["clean"][:m], c[miss], True, ev)
            self._n.inserted += m
            self._account(ev, n_ev)
            self._s.unpin(k)
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

    def _grow_for(self, n_new: int) -> None:
        """Make ``n_new`` slots free by growing the arrays (doubling, up to the capacity); at the
        capacity the kernels evict as before. REQUIRES: lock held."""
        s = self._s
        if s.n_free < n_new and s.n < self.capacity_rows:
            s.resize(min(self.capacity_rows, max(2 * s.n, len(self) + int(n_new))), limit=self.capacity_rows)

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
        self._n.left(ev)
        return ev

    def put(self, keys, rows, dirty=False, pin: bool = False, freq=None, at=None, absent: bool = False) -> Evicted:
        """Insert or assign rows, evicting as needed; -> the evicted rows (dump the dirty ones).

        keys (n,), rows (n, W) (with ``at`` (n,) int64: (m, W) C order, the row of ``keys[i]`` being
        ``rows[at[i]]``, read in place), dirty bool or (n,) bool (OR-ed into a cached row's flag), freq
        int or (n,) int64 accesses to add (default 1 each). Later duplicates win. With ``pin`` every
        distinct key gets one pin. Raises CacheBudgetError, leaving the cache unchanged, when the
        call cannot fit: with ``pin``, rows pinned afterwards > capacity; without, pinned rows +
        new rows > capacity. ``absent``: keys vouched distinct, uncached: no budget probe (a cached one is assigned)."""
        k = as_keys(keys)
        n = k.shape[0]
        r, a = self._rows_in(rows, at, n)
        # writable C arrays, always: a read-only view would be a second Numba specialisation of put,
        # compiled mid-run the first time a caller happens to pass one
        d = np.require(np.broadcast_to(np.asarray(dirty, dtype=np.bool_), (n,)), requirements=("C", "W"))
        f = np.asarray(1 if freq is None else freq, dtype=np.int64)
        f = np.require(np.broadcast_to(f, (n,)), requirements=("C", "W"))
        with self.lock:
            if n == 0:
                return self._empty_evicted(0)
            s = self._s
            n_new, ws = ((n, self.n_pinned + n) if absent  # every key new: what put_check would count
                         else K.put_check(s.st, s.pins, s.stamp, s.mkeys, s.mvals, k, bool(pin)))
            if ws > self.capacity_rows and (pin or n_new > 0):
                raise self._budget_error(int(ws))
            self._grow_for(int(n_new))
            # room for n victims, not n_new: without pins a call can evict its own earlier keys, insert them again
            ev = self._empty_evicted(n)
            n_ev = self._s.put(k, r, d, f, bool(pin), ev, a)
            self._n.inserted += int(n_new)
            return self._account(ev, n_ev)

    def make_room(self, n_free: int) -> Evicted:
        """Evict until ``n_free`` slots are free; -> the evicted rows. The caller owns them now: dump
        the dirty ones, or :meth:`restore` them if the dump fails. Raises CacheBudgetError when
        ``n_free`` + pinned rows > capacity."""
        n_free = int(n_free)
        with self.lock:
            need = n_free - (self.capacity_rows - len(self))
            if need <= 0:   # the arrays grow when the rows come
                return self._empty_evicted(0)
            if n_free + self.n_pinned > self.capacity_rows:
                raise self._budget_error(n_free + self.n_pinned)
            self._grow_for(n_free)   # to the capacity
            return self._account(*self._s.evict(n_free, self._empty_evicted(need)))

    def evict_to(self, n_rows: int) -> Evicted:
        """Evict, in the policy's order, until at most ``n_rows`` rows are cached; -> the evicted rows
        (the caller owns them, as with :meth:`make_room`). Raises CacheBudgetError when more than
        ``n_rows`` rows are pinned."""
        n_rows = int(n_rows)
        with self.lock:
            need = len(self) - n_rows
            if need <= 0:
                return self._empty_evicted(0)
            if self.n_pinned > n_rows:
                raise self._budget_error(self.n_pinned)
            return self._account(*self._s.evict(self._s.n - n_rows, self._empty_evicted(need)))

    def set_capacity(self, capacity_rows: int) -> None:
        """Make ``capacity_rows`` the most rows this cache holds. Lowered below its slots, the arrays
        shrink (rows move to lower slots, keeping their place in the policy's order) and their
        memory goes back to the system. Raises InvalidInputError when more rows are cached
        (:meth:`evict_to` first)."""
        c = int(capacity_rows)
        with self.lock:
            if c < 1 or len(self) > c:
                raise InvalidInputError(f"set_capacity({c}): the cache holds {len(self)} rows; evict_to({c}) "
                                        "first (and the capacity must be >= 1)")
            if c < self._s.n:
                self._s.resize(c)
            self.capacity_rows = c
            self._s.st[P.ST_LRU_TARGET] = int(round(self.lru_fraction * c))

    def restore(self, ev: Evicted) -> None:
        """Put rows from :meth:`make_room` back, unpinned, with their dirty flags and frequencies
        (e.g. after a failed dump). REQUIRES: the slots they left are still free."""
        with self.lock:
            if len(self) + ev.keys.shape[0] > self.capacity_rows:
                raise self._budget_error(len(self) + ev.keys.shape[0])
            self.put(ev.keys, ev.rows, dirty=ev.dirty, pin=False, freq=ev.freq)
            self._n.inserted -= ev.keys.shape[0]
            self._n.left(ev, -1)

    def update(self, keys, rows, at=None) -> np.ndarray:
        """Assign rows of cached keys and mark them dirty (not an access) -> found (n,) bool.
        Keys not cached are left out (found False). ``rows`` and ``at`` as in :meth:`put`."""
        k = as_keys(keys)
        r, a = self._rows_in(rows, at, k.shape[0])
        found = np.empty(k.shape[0], dtype=np.bool_)
        with self.lock:
            if k.shape[0]:
                M.update(self._s.rows, self._s.dirty, self._s.mkeys, self._s.mvals, k, r, a, found)
        return found

    def _rows_in(self, rows, at, n: int):
        """(rows, at) of a call that reads the rows of n keys: ``rows`` (n, W) as given (cast, C order)
        and ``NO_AT``, or with ``at`` (n,) int64 rows of ``rows`` (m, W) (checked: the kernels do not)."""
        if at is None:
            return check_rows(rows, n, self.row_width, self.dtype, "rows"), NO_AT
        r, a = rows_at(rows, at, n, self.row_width, self.dtype)
        return r, (a if n else NO_AT)

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
            uk = unique_counts(k)[0]
            return self._s.discard(uk)

    def unpin(self, keys) -> None:
        """Drop one pin of each distinct key; rows reaching zero pins enter the LRU's recent end (and become
        evictable). Raises InvalidInputError, after unpinning the others, for keys not pinned."""
        k = as_keys(keys)
        with self.lock:
            if k.shape[0] == 0:
                return
            bad = self._s.unpin(k)
        if bad:
            raise InvalidInputError(f"unpin: {bad} of the keys were not pinned (or not cached)")

    def take(self, keys, out=None, at=None):
        """Move the rows of distinct ``keys`` (n,) uint64 out to another tier: -> (out, hit (n,) bool),
        the row of a hit ``keys[i]`` written to ``out[at[i]]`` (``out``: (m, W) of the cache's dtype,
        C order, default a new (n, W) array; ``at`` (n,) int64 rows of ``out``, default 0..n-1), rows
        of misses left as they were. Hit rows leave the cache unless pinned, dirty or not,
        without being dumped (the caller now holds their current rows and puts them back, dirty,
        when done); each key's access (one per key) goes to its frequency, for a miss to the ghost
        table, so it counts when the key comes back. Counts hits and misses like :meth:`lookup`.
        Nothing is inserted, so nothing is evicted."""
        k = as_keys(keys)
        out, at = rows_at(out, at, k.shape[0], self.row_width, self.dtype)
        return self._take_unchecked(k, out, at)

    def _take_unchecked(self, k, out, at, slots=None):
        """:meth:`take` with no validation, before kernels that check no bounds: only :meth:`take` and
        ``MemPS.take`` call it, each with ``k`` from ``as_keys`` and ``(out, at)`` from ``rows_at`` (a
        row of ``at`` outside ``out`` would write out of bounds). ``slots``: :meth:`_find_unchecked`
        of ``k``, the cache unchanged since (the caller holds a lock over both calls), else found here.
        Thread-safe (takes the lock)."""
        n = k.shape[0]
        hit = np.zeros(n, dtype=np.bool_)
        with self.lock:
            n_hit = 0
            if n:
                n_hit = self._s.take(k, self._find_unchecked(k) if slots is None else slots, out, at, hit)
            self._n.batch(n_hit, n - n_hit)
        return out, hit

    def dirty_rows(self, rows: bool = True):
        """(keys (m,) uint64, rows (m, W); None without ``rows``) copies of every dirty cached row, in slot order."""
        with self.lock:
            s = K.dirty_slots(self._s.dirty, self._s.where)
            return self._s.skey[s], self._s.rows[s] if rows else None

    def mark_clean(self, keys) -> None:
        """Clear the dirty flag of cached ``keys`` (after their rows reached the store)."""
        k = as_keys(keys)
        with self.lock:
            if k.shape[0]:
                M.mark_clean(self._s.dirty, self._s.mkeys, self._s.mvals, k)

    def flush(self, dump, chunk_bytes: int = FLUSH_CHUNK_BYTES, before=None) -> int:
        """Dump every dirty row with ``dump(keys, rows)``, ``chunk_bytes`` of rows per call (memory
        stays bounded however large the cache: a chunk's slots, keys and rows are all it copies),
        marking each chunk clean once its dump returned; -> rows dumped. ``before(m)``, when given,
        runs (lock held) before each chunk of ``m`` rows and may evict rows or shrink the cache
        (the scan then starts over). If a dump raises, its chunk and the rest stay dirty."""
        with self.lock:
            step = max(1, int(chunk_bytes) // max(1, self.row_width * self.dtype.itemsize))
            n, start = 0, 0
            while True:   # O(dirty bytes / chunk_bytes) calls
                s = self._s.dirty_slots(start, step)
                if s.shape[0] == 0:
                    return n
                if before is not None:
                    shape = (len(self), self._s.n)
                    before(s.shape[0])
                    if (len(self), self._s.n) != shape:   # rows left or moved: look again
                        start = 0
                        continue
                dump(self._s.skey[s], self._s.rows[s])
                self.mark_clean(self._s.skey[s])
                n, start = n + s.shape[0], int(s[-1]) + 1

    def evict_all(self) -> Evicted:
        """Evict every unpinned row (e.g. on shutdown); -> the evicted rows."""
        with self.lock:
            return self.evict_to(self.n_pinned)
