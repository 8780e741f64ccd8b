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
- Empty batches are no-ops. All calls block until the result is ready.
- ``device="cuda"``: inputs may be NumPy arrays or ``__cuda_array_interface__`` arrays (CuPy, Numba);
  results are device arrays when the keys were on the device (zero-copy), host arrays otherwise.

Thread safety: a ``HashTable`` serialises its own calls with a lock, so it may be shared by threads.
"""

from __future__ import annotations

import threading

import numpy as np

from .errors import HashTableFullError, InvalidInputError, InvalidTypeError

#: Default fraction of slots the table may fill at ``capacity`` live keys.
DEFAULT_MAX_LOAD_FACTOR = 0.5
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def slots_for(capacity: int, max_load_factor: float) -> int:
    """Power-of-two slot count that keeps ``capacity`` keys at or below ``max_load_factor``."""
    need = max(2, int(np.ceil(capacity / max_load_factor)))
    return 1 << (need - 1).bit_length()


def _make_impl(device: str, n_slots: int, dim: int, dtype):
    if device == "cpu":
        from ._table_cpu import CpuTableImpl

        return CpuTableImpl(n_slots, dim, dtype)
    if device == "cuda":
        from .gpu._table_cuda import CudaTableImpl

        return CudaTableImpl(n_slots, dim, dtype)
    raise InvalidInputError(f"device must be 'cpu' or 'cuda', got {device!r}")


class HashTable:
    """Open-addressing key -> row table. See the module docstring for the full contract.

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
        if int(capacity) != capacity or capacity <= 0:
            raise InvalidInputError(f"capacity must be a positive integer, got {capacity!r}")
        if int(dim) != dim or dim <= 0:
            raise InvalidInputError(f"dim must be a positive integer, got {dim!r}")
        if not 0.0 < max_load_factor <= 1.0:
            raise InvalidInputError(f"max_load_factor must be in (0, 1], got {max_load_factor!r}")
        try:
            dt = np.dtype(dtype)
        except TypeError as e:
            raise InvalidTypeError(f"dtype must be float32 or float64, got {dtype!r}") from e
        if dt not in _DTYPES:
            raise InvalidTypeError(f"dtype must be float32 or float64, got {dt}")
        self._capacity = int(capacity)
        self._dim = int(dim)
        self._dtype = dt
        self._max_load_factor = float(max_load_factor)
        n_slots = slots_for(self._capacity, self._max_load_factor)
        #: live + tombstone slots may not pass this, so probing always ends at an empty slot
        self._slot_budget = min(n_slots - 1, int(np.ceil(self._capacity / self._max_load_factor)))
        self._impl = _make_impl(device, n_slots, self._dim, dt)
        self._size = 0
        self._tombstones = 0
        self._lock = threading.RLock()

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
    def load_factor(self) -> float:
        """Live keys / slots."""
        return self._size / self._impl.n_slots

    def __len__(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return (f"HashTable(capacity={self._capacity}, dim={self._dim}, device={self.device!r}, "
                f"dtype={self._dtype.name}, size={self._size})")

    # -- public batch operations --------------------------------------------------------------------
    def insert(self, keys, values) -> None:
        """Insert or assign. keys (n,) uint64; values (n, dim). Later duplicates win. Blocking."""
        self._upsert(keys, values, accumulate=False)

    def accumulate(self, keys, deltas) -> None:
        """Add ``deltas`` (n, dim) to the rows of ``keys``; missing keys start from zeros. Blocking."""
        self._upsert(keys, deltas, accumulate=True)

    def get(self, keys, out=None):
        """(values (n, dim), found (n,) bool); zeros where a key is missing. Blocking.

        ``out``: optional (n, dim) array of the table dtype that receives the values and is returned
        (no allocation per call; a device array on ``cuda``)."""
        with self._lock:
            k, on_dev = self._impl.keys_in(keys)
            vals, found = self._impl.get(k, out)
            if out is not None and isinstance(out, np.ndarray) and out is not vals:
                vals.copy_to_host(out)  # a cuda table filling a host ``out``
                return out, self._impl.out(found, on_dev)
            return self._impl.out(vals, on_dev), self._impl.out(found, on_dev)

    def contains(self, keys):
        """found (n,) bool. Blocking."""
        with self._lock:
            k, on_dev = self._impl.keys_in(keys)
            return self._impl.out(self._impl.contains(k), on_dev)

    def erase(self, keys) -> int:
        """Remove keys; returns how many were present (a key repeated in ``keys`` counts once)."""
        with self._lock:
            k, _ = self._impl.keys_in(keys)
            if k.shape[0] == 0:
                return 0
            n = self._impl.erase(k)
            self._size -= n
            self._tombstones += n
            return n

    def export(self):
        """(keys (m,) uint64, values (m, dim)) of every live entry, in no particular order; host arrays."""
        with self._lock:
            return self._impl.export()

    def clear(self) -> None:
        """Remove every entry (keeps the memory)."""
        with self._lock:
            self._impl.clear()
            self._size = 0
            self._tombstones = 0

    # -- two-phase protocol (used by PartitionedHashTable to stay atomic across parts) -------------
    def _validate(self, keys, rows, name):
        k, on_dev = self._impl.keys_in(keys)
        r = self._impl.rows_in(rows, k.shape[0], name)
        return k, r

    def _make_room(self, n: int) -> None:
        """REQUIRES: lock held. Drop tombstones if ``n`` more slots could pass the slot budget."""
        if self._tombstones and self._size + self._tombstones + n > self._slot_budget:
            keys, vals = self._impl.export()
            self._impl.clear()
            if keys.shape[0]:
                k, _ = self._impl.keys_in(keys)
                self._impl.upsert(k, self._impl.rows_in(vals, k.shape[0]), False)
            self._tombstones = 0

    def _claim(self, k):
        """REQUIRES: lock held. Claim slots for validated keys; returns a ticket for commit/rollback,
        or raises HashTableFullError with the table unchanged."""
        self._make_room(k.shape[0])
        slots, is_new, n_new, n_revived, n_failed = self._impl.claim(k)
        if n_failed or self._size + n_new > self._capacity:
            self._impl.rollback(slots, is_new)
            new = f"more than {n_new}" if n_failed else f"{n_new}"
            raise HashTableFullError(
                f"HashTable is full: {self._size} live keys + {new} new keys in this call > "
                f"capacity {self._capacity}; nothing was changed. Build a table with a larger capacity "
                "or erase keys first")
        return slots, is_new, n_new, n_revived

    def _rollback(self, ticket) -> None:
        self._impl.rollback(ticket[0], ticket[1])

    def _commit(self, ticket, rows, accumulate: bool) -> None:
        slots, _, n_new, n_revived = ticket
        self._impl.write(slots, rows, accumulate)
        self._size += n_new
        self._tombstones -= n_revived

    def _upsert(self, keys, rows, accumulate: bool) -> None:
        with self._lock:
            k, r = self._validate(keys, rows, "deltas" if accumulate else "values")
            n = k.shape[0]
            if n == 0:
                return
            self._make_room(n)
            if self._size + n <= self._capacity and self._size + self._tombstones + n <= self._slot_budget:
                # room for every key even if all are new: one fused pass, nothing to undo
                n_new, n_revived = self._impl.upsert(k, r, accumulate)
                self._size += n_new
                self._tombstones -= n_revived
                return
            ticket = self._claim(k)
            self._commit(ticket, r, accumulate)
