"""``HashTable``: a batch key -> vector table on the CPU (Numba) or a GPU (Numba CUDA).

This is the HBM-PS building block of the paper (Section 4.1, Algorithm 2 of
``shared/seeds/004``), usable on its own::

    t = HashTable(capacity=1_000_000, dim=32, device="cpu")   # or device="cuda"
    t.insert(keys, values)          # keys (n,) uint64 (int64 reinterpreted); values (n, dim)
    vals, found = t.get(keys)       # (n, dim) zeros where missing; (n,) bool
    t.accumulate(keys, deltas)      # add; a missing key starts from zeros; duplicates all add up

Contract
--------
- Keys are uint64; ``2**64 - 1`` (-1 as int64) is the reserved empty-slot sentinel and is rejected.
- ``capacity`` live keys are always accepted. The slot array has ``next_pow2(capacity /
  max_load_factor)`` slots and is allocated once, at construction; kernels never allocate.
- A call that would exceed ``capacity`` raises :class:`HashTableFullError` and leaves the table exactly
  as it was: no key gains, loses or changes a value.
- Duplicate keys in one ``insert``: the last occurrence wins (both backends). In ``accumulate`` every
  occurrence adds up (atomically on the GPU).
- Erased keys leave tombstones; :meth:`HashTable.purge` (and any insert that needs their slots)
  re-lays the live entries in place, on the table's device, without a round trip through the host.
- :meth:`HashTable.reserve` grows the table to a larger ``capacity`` between calls, keeping every
  entry; a table never shrinks.
- Empty batches are no-ops.
- A training step reads and writes back the rows of resident keys with :meth:`HashTable.find_rows` and
  :meth:`HashTable.write_rows` (``_rows.py``): one probe a key, keys validated where they entered.
- ``device="cuda"``: inputs may be NumPy arrays or ``__cuda_array_interface__`` arrays (CuPy, Numba);
  results are device arrays when the keys were on the device (zero-copy), host arrays otherwise.

Blocking and streams (as cuCollections: ``insert`` blocks, ``insert_async`` does not)
-------------------------------------------------------------------------------------
Every call takes ``stream`` (0 / None: the legacy default stream; a Numba or CuPy stream). The plain
calls block until their result is ready, synchronising that stream only. The ``*_async`` calls
(:meth:`insert_async`, :meth:`accumulate_async`, :meth:`get_async`, :meth:`contains_async`,
:meth:`erase_async`) take device arrays, enqueue their kernels on ``stream`` and return; order the
streams that produce their inputs and read their outputs yourself. Their counts (keys new, erased)
reach ``len(table)`` at the next blocking call or :meth:`synchronize`. An asynchronous insert that
might not fit (by the upper bound of what is in flight) first settles and, if the table is nearly
full, runs as the blocking insert (so a full table still raises and changes nothing). The sentinel key
is not checked in asynchronous calls (REQUIRES): lookups answer it absent, inserts skip it and the next
:meth:`synchronize` raises. A table's calls stay in issue order across streams. On ``"cpu"`` every call
completes before it returns.

Thread safety: a ``HashTable`` serialises its calls with a lock, so it may be shared by threads; on the
CPU ``find_rows``/``write_rows`` take a row lock alone, and run during an eviction's sink (``_rows.py``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import NamedTuple

import numpy as np

from .._checks import allocated, positive_int, unit_fraction
from ..errors import HashTableFullError, InvalidInputError, InvalidTypeError
from ._cache import CacheOps
from ._rows import RowOps

#: Default fraction of slots the table may fill at ``capacity`` live keys.
DEFAULT_MAX_LOAD_FACTOR = 0.5
#: Bytes a slot holds besides its row: key (uint64), state (int32) and cache score (uint64); the CUDA
#: table adds the ``owner`` scratch (int32). For memory budgets (``hps/train/_budget.py``).
SLOT_OVERHEAD_BYTES = {"cpu": 20, "cuda": 24}
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def slots_for(capacity: int, max_load_factor: float) -> int:
    """Power-of-two slot count that keeps ``capacity`` keys at or below ``max_load_factor``."""
    need = max(2, int(np.ceil(capacity / max_load_factor)))
    return 1 << (need - 1).bit_length()


class TableView(NamedTuple):
    """Non-owning view of a table's slot arrays for kernels (device arrays on ``cuda``, NumPy on
    ``cpu``); see :meth:`HashTable.device_view`. Layout: ``hps/table/_cpu_kernels.py``."""

    keys: object        #: (S,) uint64, the key of each slot; all ones where empty
    state: object       #: (S,) int32, 0 live, 1 tombstone
    values: object      #: (S, dim) float, the row of each slot; zeros where not live
    generation: int     #: HashTable.generation when the view was taken


def _make_impl(device: str, n_slots: int, dim: int, dtype):
    if device == "cpu":
        from ._cpu import CpuTableImpl

        return CpuTableImpl(n_slots, dim, dtype)
    if device == "cuda":
        from ._cuda import CudaTableImpl

        return CudaTableImpl(n_slots, dim, dtype)
    raise InvalidInputError(f"device must be 'cpu' or 'cuda', got {device!r}")


class HashTable(CacheOps, RowOps):
    """Open-addressing key -> row table. See the module docstring for the full contract; as the HBM-PS
    cache across batches, :meth:`lookup` and :meth:`evict` (``_cache.py``); the train step's
    :meth:`find_rows` and :meth:`write_rows` (``_rows.py``).

    Args:
        capacity: live keys the table is guaranteed to hold (> 0).
        dim: row width (> 0).
        device: ``"cpu"`` (Numba, default) or ``"cuda"`` (Numba CUDA; raises
            :class:`DeviceUnavailableError` at construction without a usable GPU).
        dtype: float32 (default) or float64.
        max_load_factor: in (0, 1]; the slot array is sized so that ``capacity`` keys fill at most
            this fraction of it (default 0.5).
    """

    def __init__(self, capacity: int, dim: int, device: str = "cpu", dtype=np.float32,
                 max_load_factor: float = DEFAULT_MAX_LOAD_FACTOR):
        capacity, dim = positive_int(capacity, "capacity"), positive_int(dim, "dim")
        max_load_factor = unit_fraction(max_load_factor, "max_load_factor")
        try:
            dt = np.dtype(dtype)
        except TypeError as e:
            raise InvalidTypeError(f"dtype must be float32 or float64, got {dtype!r}") from e
        if dt not in _DTYPES:
            raise InvalidTypeError(f"dtype must be float32 or float64, got {dt}")
        self._dim, self._dtype = int(dim), dt
        self._max_load_factor = float(max_load_factor)
        self._set_capacity(int(capacity))
        n_slots = slots_for(self._capacity, self._max_load_factor)
        self._impl = allocated(lambda: _make_impl(device, n_slots, self._dim, dt),
                               f"capacity {capacity:,} needs {n_slots:,} slots of {self._dim} x {dt}")
        self._size = 0
        self._tombstones = 0
        self._maybe_new = 0      # keys of asynchronous inserts not yet settled (upper bound of new ones)
        self._maybe_erased = 0   # keys of asynchronous erases not yet settled
        self._generation = 0
        self._open_views = 0
        self._lock = threading.RLock()   # every call but the row path's; taken before _rows
        self._rows = threading.RLock()   # keys, states and rows of live slots (``_rows.py``)

    def _set_capacity(self, capacity: int) -> None:
        self._capacity = capacity
        n_slots = slots_for(capacity, self._max_load_factor)
        #: live + tombstone slots may not pass this, so probing always ends at an empty slot
        self._slot_budget = min(n_slots - 1, int(np.ceil(capacity / self._max_load_factor)))

    # -- properties ---------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def device(self) -> str:
        return self._impl.device

    @property
    def n_slots(self) -> int:
        return self._impl.n_slots

    @property
    def generation(self) -> int:
        """Bumped by every call that moves entries between slots (:meth:`purge`, :meth:`reserve`,
        :meth:`clear`, an insert that purges tombstones): a slot found in one generation holds the
        same key until the key is erased or the generation changes."""
        return self._generation

    @property
    def load_factor(self) -> float:
        """Live keys / slots."""
        return len(self) / self._impl.n_slots

    def __len__(self) -> int:
        """Live keys (settles asynchronous calls first: may block)."""
        with self._lock:
            self._settle()
            return self._size

    def __repr__(self) -> str:
        return (f"HashTable(capacity={self._capacity}, dim={self._dim}, device={self.device!r}, "
                f"dtype={self._dtype.name}, size={self._size})")

    # -- public batch operations --------------------------------------------------------------------
    def insert(self, keys, values, stream=None) -> None:
        """Insert or assign. keys (n,) uint64; values (n, dim). Later duplicates win. Blocking."""
        self._upsert(keys, values, False, stream)

    def accumulate(self, keys, deltas, stream=None) -> None:
        """Add ``deltas`` (n, dim) to the rows of ``keys``; missing keys start from zeros. Blocking."""
        self._upsert(keys, deltas, True, stream)

    def get(self, keys, out=None, stream=None):
        """(values (n, dim), found (n,) bool); zeros where a key is missing. Blocking.

        ``out``: optional (n, dim) array of the table dtype that receives the values and is returned
        (no allocation per call; a device array on ``cuda``)."""
        with self._lock, self._rows, self._impl.scope():
            self._settle()
            k, on_dev = self._impl.keys_in(keys, stream=stream)
            vals, found = self._impl.get(k, out, on_dev, stream)
            if out is not None and isinstance(out, np.ndarray) and out is not vals:
                vals.copy_to_host(out)  # a cuda table filling a host ``out``
                return out, self._impl.out(found, on_dev, stream)
            return self._impl.out(vals, on_dev, stream), self._impl.out(found, on_dev, stream)

    def contains(self, keys, stream=None):
        """found (n,) bool. Blocking."""
        with self._lock, self._impl.scope():
            self._settle()
            k, on_dev = self._impl.keys_in(keys, stream=stream)
            return self._impl.out(self._impl.contains(k, on_dev, stream), on_dev, stream)

    def erase(self, keys, stream=None) -> int:
        """Remove keys; returns how many were present (a key repeated in ``keys`` counts once). Blocking."""
        with self._lock, self._rows, self._impl.scope():
            self._settle()
            k, _ = self._impl.keys_in(keys, stream=stream)
            if k.shape[0] == 0:
                return 0
            n = self._impl.erase(k, stream)
            self._size -= n
            self._tombstones += n
            return n

    # -- asynchronous batch operations (device arrays; see the module docstring) ----------------------
    def insert_async(self, keys, values, stream=0) -> None:
        """:meth:`insert` enqueued on ``stream``; keys (n,) uint64 and values (n, dim) device arrays."""
        self._upsert_async(keys, values, False, stream)

    def accumulate_async(self, keys, deltas, stream=0) -> None:
        """:meth:`accumulate` enqueued on ``stream``; device arrays."""
        self._upsert_async(keys, deltas, True, stream)

    def get_async(self, keys, out, found, stream=0) -> None:
        """out (n, dim) of the table dtype and found (n,) bool, device arrays, receive each key's row
        (zeros where missing) and whether it is live. Enqueued on ``stream``."""
        with self._lock, self._rows:
            k, _ = self._impl.keys_in(keys, stream=stream, blocking=False)
            self._impl.get_async(k, self._out_arg(out, (k.shape[0], self._dim), self._dtype, "out"),
                                 self._out_arg(found, (k.shape[0],), np.bool_, "found"), stream)

    def contains_async(self, keys, found, stream=0) -> None:
        """found (n,) bool device array: each key is live. Enqueued on ``stream``."""
        with self._lock:
            k, _ = self._impl.keys_in(keys, stream=stream, blocking=False)
            self._impl.contains_async(k, self._out_arg(found, (k.shape[0],), np.bool_, "found"), stream)

    def erase_async(self, keys, stream=0) -> None:
        """:meth:`erase` enqueued on ``stream`` (the count reaches ``len`` at the next settle)."""
        with self._lock, self._rows:
            k, _ = self._impl.keys_in(keys, stream=stream, blocking=False)
            if k.shape[0]:
                self._impl.erase_async(k, stream)
                self._maybe_erased += k.shape[0]

    def synchronize(self) -> None:
        """Wait for this table's asynchronous calls and fold their counts into ``len``. Raises
        InvalidInputError when one of them held the sentinel key (those keys were skipped)."""
        with self._lock:
            self._settle()

    def _out_arg(self, a, shape, dtype, name):
        view = self._impl.device_out(a)
        if tuple(view.shape) != shape or view.dtype != np.dtype(dtype):
            raise InvalidInputError(f"{name} must have shape {shape} and dtype {np.dtype(dtype)}, got "
                                    f"{tuple(view.shape)} {view.dtype}")
        return view

    def _settle(self) -> None:
        """REQUIRES: lock held. Fold the counts of asynchronous calls into the size (blocks if any)."""
        if not (self._maybe_new or self._maybe_erased):
            return
        new, revived, failed, erased = (int(c) for c in self._impl.settle())
        self._maybe_new = self._maybe_erased = 0
        self._size += new - erased
        self._tombstones += erased - revived
        if failed:
            raise InvalidInputError(f"{failed} keys of earlier insert_async calls were the reserved sentinel "
                                    "key 2**64-1 and were not inserted (the others were)")

    def export(self):
        """(keys (m,) uint64, values (m, dim)) of every live entry, in no particular order; host arrays."""
        with self._lock, self._rows:
            self._settle()
            return self._impl.export(self._size)

    def live_keys(self) -> np.ndarray:
        """(m,) uint64 host array of every live key, in no particular order; what :meth:`export`
        returns without the rows (none is copied). Blocking."""
        with self._lock:
            self._settle()
            return self._impl.live_keys(self._size)

    def clear(self) -> None:
        """Remove every entry (keeps the memory)."""
        with self._lock, self._rows:
            self._settle()
            self._check_no_view("clear")
            self._impl.clear()
            self._size = 0
            self._tombstones = 0
            self._generation += 1

    # -- growth and purge -----------------------------------------------------------------------------
    def reserve(self, capacity: int) -> None:
        """Make room for ``capacity`` live keys, keeping every entry (and dropping tombstones) when the
        slot array grows. Never shrinks: a ``capacity`` at or below :attr:`capacity` does nothing.
        The entries move on the table's device (no host round trip); the new slot array is allocated
        before anything changes, so an allocation failure leaves the table as it was. Needs, for a
        moment, the old and the new slot arrays plus ``len(self)`` rows of scratch. Blocking."""
        capacity = positive_int(capacity, "capacity")
        with self._lock:
            if capacity <= self._capacity:
                return
            self._settle()
            self._check_no_view("reserve")
            n_slots = slots_for(int(capacity), self._max_load_factor)
            if n_slots != self._impl.n_slots:   # on the CPU all but the rows' copy before the row path waits
                plan = allocated(lambda: (self._impl.regrow(n_slots),) if self.device == "cpu" else (),
                                 f"capacity {capacity:,} needs {n_slots:,} slots (the table is unchanged)")
                with self._rows:
                    self._rebuild(n_slots, *plan)
            self._set_capacity(int(capacity))

    def purge(self) -> None:
        """Drop every tombstone by re-laying the live entries in place, on the table's device (the
        CUDA table gathers live keys and rows into device scratch, clears, re-inserts; nothing but
        counters crosses to the host). Inserts also do this by themselves when tombstones would
        crowd out new keys. Blocking."""
        with self._lock, self._rows:
            self._settle()
            self._check_no_view("purge")
            if self._tombstones:
                self._rebuild(self._impl.n_slots)

    def _rebuild(self, n_slots: int, *plan) -> None:
        """REQUIRES: both locks held, no view open. ``plan``: the CPU's growth made ready (``regrow``)."""
        self._impl.rebuild(n_slots, self._size, *plan)
        self._tombstones = 0
        self._generation += 1

    def _check_no_view(self, op: str) -> None:
        if self._open_views:
            raise InvalidInputError(f"HashTable.{op} would move entries while a device_view() is open; "
                                    "leave the view's with-block first")

    # -- kernel access ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def device_view(self):
        """``with table.device_view() as v:`` the slot arrays (a :class:`TableView`) for kernels that
        read entries and update the rows of live slots in place (``hps.gpu``'s training kernels).
        The table's locks are held for the whole block, so no other thread reads or writes a row,
        inserts, erases, purges or grows meanwhile. Inside it, :meth:`purge`, :meth:`reserve` and
        :meth:`clear` (which would move entries) raise :class:`InvalidInputError`, and inserts do not
        purge tombstones. REQUIRES of the kernels: they write only rows of live slots (never keys,
        states, or rows of other slots). Kernels launched inside the block on a blocking CUDA stream are
        ordered before the table's next call on the legacy default stream (``stream`` 0, the default);
        a call on another stream must be ordered by the caller (an event). Keep slots across blocks only
        while :attr:`generation` is unchanged and their keys are not erased. Settles asynchronous calls
        first."""
        with self._lock, self._rows:
            self._settle()
            self._open_views += 1
            try:
                yield TableView(self._impl.tkeys, self._impl.tstate, self._impl.tvals, self._generation)
            finally:
                self._open_views -= 1

    # -- two-phase protocol (used by PartitionedHashTable to stay atomic across parts) -------------
    def _validate(self, keys, rows, name, stream=None):
        k, on_dev = self._impl.keys_in(keys, stream=stream)
        if on_dev:
            self._impl.check_sentinel(k, "keys", stream)
        r = self._impl.rows_in(rows, k.shape[0], name, stream)
        return k, r

    def _room(self, n: int, exact: bool) -> bool:
        """Room for ``n`` more keys even if all are new (by upper bounds unless ``exact``)."""
        size = self._size + (0 if exact else self._maybe_new)
        tombs = self._tombstones + (0 if exact else self._maybe_erased)
        return size + n <= self._capacity and size + tombs + n <= self._slot_budget

    def _make_room(self, n: int) -> None:
        """REQUIRES: lock held, settled. Drop tombstones if ``n`` more slots could pass the slot budget."""
        crowded = self._size + self._tombstones + n > self._slot_budget
        if self._tombstones and crowded and not self._open_views:
            self._rebuild(self._impl.n_slots)

    def _claim(self, k, stream=None):
        """REQUIRES: lock held, settled. Claim slots for validated keys; returns a ticket for
        commit/rollback, or raises HashTableFullError with the table unchanged."""
        with self._rows:
            self._make_room(k.shape[0])
            slots, is_new, n_new, n_revived, n_failed = self._impl.claim(k, stream)
            if n_failed or self._size + n_new > self._capacity:
                self._impl.rollback(slots, is_new, stream)
                new = f"more than {n_new}" if n_failed else f"{n_new}"
                raise HashTableFullError(
                    f"HashTable is full: {self._size} live keys + {new} new keys in this call > capacity "
                    f"{self._capacity}; nothing was changed. Build a table with a larger capacity or erase "
                    "keys first")
        return slots, is_new, n_new, n_revived

    def _rollback(self, ticket, stream=None) -> None:
        with self._rows:   # REQUIRES: lock held (as _claim and _commit)
            self._impl.rollback(ticket[0], ticket[1], stream)

    def _commit(self, ticket, rows, accumulate: bool, stream=None) -> None:
        slots, _, n_new, n_revived = ticket
        with self._rows:
            self._impl.write(slots, rows, accumulate, stream)
        self._size += n_new
        self._tombstones -= n_revived

    def _upsert(self, keys, rows, accumulate: bool, stream=None) -> None:
        with self._lock, self._rows, self._impl.scope():
            self._settle()
            k, r = self._validate(keys, rows, "deltas" if accumulate else "values", stream)
            n = k.shape[0]
            if n == 0:
                return
            self._make_room(n)
            if self._room(n, exact=True):
                # room for every key even if all are new: one fused pass, nothing to undo
                n_new, n_revived = self._impl.upsert(k, r, accumulate, stream)
                self._size += n_new
                self._tombstones -= n_revived
                return
            self._commit(self._claim(k, stream), r, accumulate, stream)

    def _upsert_async(self, keys, rows, accumulate: bool, stream) -> None:
        with self._lock, self._rows:
            k, _ = self._impl.keys_in(keys, stream=stream, blocking=False)
            name = "deltas" if accumulate else "values"
            r = self._impl.rows_in(rows, k.shape[0], name, stream, blocking=False)
            n = k.shape[0]
            if n == 0:
                return
            if not self._room(n, exact=False):  # might not fit: settle, purge, and if still tight block
                self._settle()
                self._make_room(n)
                if not self._room(n, exact=True):
                    self._commit(self._claim(k, stream), r, accumulate, stream)
                    return
            self._impl.upsert_async(k, r, accumulate, stream)
            self._maybe_new += n
