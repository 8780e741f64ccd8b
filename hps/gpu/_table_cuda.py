"""CUDA backend of :class:`hps.HashTable`: owns the device slot arrays, launches ``_table_kernels``.

The host object owns all table memory (slots, rows, the per-slot ``owner`` scratch, the counters),
allocated once at construction; kernels get non-owning views and never allocate. Per call, only
the arrays a call returns (``get``/``contains``/``claim`` outputs) and copies of host inputs are
allocated.

Inputs: NumPy arrays (copied to the device) or any ``__cuda_array_interface__`` array (CuPy, Numba
device arrays; used zero-copy). Results are Numba device arrays when the caller's keys were on the
device, NumPy arrays otherwise (see :meth:`CudaTableImpl.out`). Every method blocks until its
work on the default stream is done.

Not thread-safe on its own; :class:`hps.HashTable` serialises calls.
"""

from __future__ import annotations

import numpy as np

from .._extras import install_hint
from .._keys import EMPTY_KEY, as_keys, check_rows
from ..errors import DeviceUnavailableError, InternalError, InvalidInputError, InvalidTypeError

try:
    from numba import cuda

    from . import _table_kernels as K
except Exception as e:  # numba-cuda missing or broken: reported at construction
    cuda = None
    K = None
    _IMPORT_ERROR: Exception | None = e
else:
    _IMPORT_ERROR = None

#: Threads per block of every launch (tests patch it small so tiny inputs span several blocks).
BLOCK_SIZE = 256
#: ``owner`` scratch is int32: a batch may hold at most this many keys.
MAX_BATCH = 2**31 - 1


def _require_gpu() -> None:
    """Raise DeviceUnavailableError unless numba.cuda can reach a GPU (or runs the simulator)."""
    if _IMPORT_ERROR is not None:
        raise DeviceUnavailableError(
            f"device='cuda' needs numba-cuda, which failed to import ({_IMPORT_ERROR!r}); "
            f"{install_hint('gpu')} or use device='cpu'") from _IMPORT_ERROR
    try:
        ok = cuda.is_available()
    except Exception as e:
        raise DeviceUnavailableError(f"device='cuda' but CUDA could not be initialised: {e}; "
                                     "use device='cpu'") from e
    if not ok:
        raise DeviceUnavailableError(
            "device='cuda' but no usable CUDA GPU was found (numba.cuda.is_available() is False: "
            "no NVIDIA GPU, driver or CUDA runtime); use device='cpu'")
    try:
        cuda.current_context()
    except Exception as e:
        raise DeviceUnavailableError(f"device='cuda' but the CUDA context could not be created: {e}; "
                                     "use device='cpu'") from e


def _device_view(x):
    """A Numba device array viewing ``x`` (zero-copy) if ``x`` lives on the GPU, else None."""
    if getattr(x, "__cuda_ndarray__", False):  # Numba device array (or the simulator's)
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return cuda.as_cuda_array(x)
    return None


def _next_pow2(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


class CudaTableImpl:
    """Slot arrays on the current CUDA device; the interface of :class:`hps._table_cpu.CpuTableImpl`.

    Device arrays: ``tkeys`` (S,) uint64, ``tstate`` (S,) int32, ``tvals`` (S, dim) dtype,
    ``owner`` (S,) int32 scratch (-1 between calls), ``counts`` (3,) int64, ``hit`` (1,) int64.
    """

    device = "cuda"

    def __init__(self, n_slots: int, dim: int, dtype):
        _require_gpu()
        self.dim = int(dim)
        self.dtype = np.dtype(dtype)
        self._set_slots(*self._alloc_slots(int(n_slots)))
        self.counts = cuda.device_array(3, dtype=np.int64)
        self.hit = cuda.device_array(1, dtype=np.int64)
        self._h_counts = cuda.pinned_array(3, dtype=np.int64)
        self._h_zeros = cuda.pinned_array(3, dtype=np.int64)
        self._h_zeros[:] = 0
        self.clear()

    def _alloc_slots(self, n_slots: int):
        """New (uninitialised) slot arrays: tkeys (S,) uint64, tstate (S,) int32, tvals (S, dim), owner
        (S,) int32. Raises (CUDA out of memory) before anything of the table changed."""
        return (cuda.device_array(n_slots, dtype=np.uint64), cuda.device_array(n_slots, dtype=np.int32),
                cuda.device_array((n_slots, self.dim), dtype=self.dtype),
                cuda.device_array(n_slots, dtype=np.int32))

    def _set_slots(self, tkeys, tstate, tvals, owner) -> None:
        self.tkeys, self.tstate, self.tvals, self.owner = tkeys, tstate, tvals, owner
        self.n_slots = tkeys.shape[0]

    # -- launch shapes ------------------------------------------------------------------------
    def _grid1(self, n: int):
        """(blocks, threads) for one thread per item."""
        return (n + BLOCK_SIZE - 1) // BLOCK_SIZE, BLOCK_SIZE

    def _grid_rows(self, n: int):
        """(blocks, (bx, by)) for row kernels: bx threads stride a row's columns, by rows a block."""
        bx = min(32, _next_pow2(self.dim), BLOCK_SIZE)
        by = max(1, BLOCK_SIZE // bx)
        return (n + by - 1) // by, (bx, by)

    def _zero_counts(self) -> None:
        self.counts.copy_to_device(self._h_zeros)

    def _read_counts(self) -> np.ndarray:
        return self.counts.copy_to_host(self._h_counts)  # synchronises

    # -- input conversion -------------------------------------------------------------------
    def keys_in(self, keys, name="keys"):
        """(device keys (n,) uint64, on_device). Host keys are validated then copied; device keys
        are used in place (int64 reinterpreted bitwise) and checked for the sentinel on the GPU."""
        d = _device_view(keys)
        if d is None:
            k = as_keys(keys, name)
            self._check_batch(k.shape[0], name)
            return cuda.to_device(k), False
        if d.ndim != 1:
            raise InvalidInputError(f"{name} must be 1-D (n,), got shape {d.shape}")
        if d.dtype == np.int64:
            d = d.view(np.uint64)
        elif d.dtype != np.uint64:
            if d.shape[0] == 0:
                return cuda.device_array(0, dtype=np.uint64), True
            raise InvalidTypeError(f"{name} must be uint64 (or int64, reinterpreted bitwise), got {d.dtype}")
        n = d.shape[0]
        self._check_batch(n, name)
        if n:
            self.hit.copy_to_device(self._h_zeros[:1])
            K.has_key[self._grid1(n)](d, EMPTY_KEY, self.hit)
            if self.hit.copy_to_host()[0]:
                raise InvalidInputError(
                    f"{name} contains the reserved sentinel key 2**64-1 (-1 as int64), which marks "
                    "empty slots; remap it before calling")
        return d, True

    @staticmethod
    def _check_batch(n: int, name: str) -> None:
        if n > MAX_BATCH:
            raise InvalidInputError(f"{name} holds {n} keys; device='cuda' takes at most {MAX_BATCH} per call")

    def rows_in(self, rows, n, name="values"):
        """Device rows (n, dim) of the table dtype. Host rows are validated (and cast like
        ``check_rows``) then copied; device rows of the right dtype are used in place, other
        numeric dtypes are converted on the GPU into a new array."""
        d = _device_view(rows)
        if d is None:
            return cuda.to_device(check_rows(rows, n, self.dim, self.dtype, name))
        if tuple(d.shape) != (n, self.dim):
            raise InvalidInputError(
                f"{name} must have shape ({n}, {self.dim}) to match the keys and dim, got {tuple(d.shape)}")
        if d.dtype == self.dtype:
            return d
        if d.dtype.kind not in "fiub":
            raise InvalidTypeError(f"{name} must be numeric ({self.dtype}), got {d.dtype}")
        out = cuda.device_array((n, self.dim), dtype=self.dtype)
        if n:
            K.cast_rows[self._grid_rows(n)](d, out)
        return out

    def out(self, arr, on_device):
        """``arr`` (a device array) as is when the caller's inputs were on the device, else on the host."""
        return arr if on_device else arr.copy_to_host()

    # -- operations (validated device inputs) --------------------------------------------------
    def upsert(self, keys, rows, accumulate: bool):
        """-> (n_new, n_revived). REQUIRES: room for every key (see HashTable._upsert)."""
        n = keys.shape[0]
        if n == 0:
            return 0, 0
        accumulate = bool(accumulate)
        self._zero_counts()
        K.upsert_claim[self._grid1(n)](self.tkeys, self.tstate, self.owner, keys, not accumulate,
                                       self.counts)
        K.upsert_rows[self._grid_rows(n)](self.tkeys, self.tvals, self.owner, keys, rows, accumulate)
        if not accumulate:
            K.unmark_keys[self._grid1(n)](self.tkeys, self.owner, keys)
        c = self._read_counts()
        return int(c[0]), int(c[1])

    def claim(self, keys):
        """-> (slots (n,) int64, is_new (n,) int8, n_new, n_revived, n_failed); device arrays."""
        n = keys.shape[0]
        slots = cuda.device_array(n, dtype=np.int64)
        is_new = cuda.device_array(n, dtype=np.int8)
        if n == 0:
            return slots, is_new, 0, 0, 0
        self._zero_counts()
        K.claim[self._grid1(n)](self.tkeys, self.tstate, keys, slots, is_new, self.counts)
        c = self._read_counts()
        return slots, is_new, int(c[0]), int(c[1]), int(c[2])

    def rollback(self, slots, is_new) -> None:
        n = slots.shape[0]
        if n:
            K.rollback[self._grid1(n)](self.tkeys, self.tstate, slots, is_new)
            cuda.synchronize()

    def write(self, slots, rows, accumulate: bool) -> None:
        n = slots.shape[0]
        if n == 0:
            return
        accumulate = bool(accumulate)
        if not accumulate:
            K.mark_slots[self._grid1(n)](self.owner, slots)
        K.write_rows[self._grid_rows(n)](self.tvals, self.owner, slots, rows, accumulate)
        if not accumulate:
            K.unmark_slots[self._grid1(n)](self.owner, slots)
        cuda.synchronize()

    def get(self, keys, out=None):
        n = keys.shape[0]
        dev_out = None if out is None else _device_view(out)
        if dev_out is None:
            out = cuda.device_array((n, self.dim), dtype=self.dtype)  # a host ``out`` is filled by the host class
        else:
            out = dev_out
            if out.shape != (n, self.dim) or out.dtype != self.dtype:
                raise InvalidInputError(f"out must have shape {(n, self.dim)} and dtype {self.dtype}, "
                                        f"got {out.shape} {out.dtype}")
        found = cuda.device_array(n, dtype=np.bool_)
        if n:
            K.get[self._grid_rows(n)](self.tkeys, self.tstate, self.tvals, keys, out, found)
            cuda.synchronize()
        return out, found

    def contains(self, keys):
        n = keys.shape[0]
        found = cuda.device_array(n, dtype=np.bool_)
        if n:
            K.contains[self._grid1(n)](self.tkeys, self.tstate, keys, found)
            cuda.synchronize()
        return found

    def erase(self, keys) -> int:
        n = keys.shape[0]
        if n == 0:
            return 0
        self._zero_counts()
        K.erase[self._grid1(n)](self.tkeys, self.tstate, self.tvals, keys, self.counts)
        return int(self._read_counts()[0])

    def _live(self, n_live: int):
        """Device (live slots (m,) int64, their keys (m,) uint64, their rows (m, dim)), m = n_live,
        the table's live-key count (kept by HashTable), checked against the kernel's count."""
        slots = cuda.device_array(n_live, dtype=np.int64)
        keys = cuda.device_array(n_live, dtype=np.uint64)
        rows = cuda.device_array((n_live, self.dim), dtype=self.dtype)
        self._zero_counts()
        K.live_slots[self._grid1(self.n_slots)](self.tkeys, self.tstate, slots, self.counts)
        found = int(self._read_counts()[0])
        if found != n_live:
            raise InternalError(f"CUDA table holds {found} live keys but its host counts {n_live} (a bug)")
        if n_live:
            K.gather_keys[self._grid1(n_live)](self.tkeys, slots, keys)
            K.gather_rows[self._grid_rows(n_live)](self.tvals, slots, rows)
        return slots, keys, rows

    def export(self, n_live: int):
        """(keys (m,) uint64, values (m, dim)) host arrays of the ``n_live`` live entries, in no
        particular order. Only the live keys and rows cross to the host, not the slot arrays."""
        _, keys, rows = self._live(n_live)
        return keys.copy_to_host(), rows.copy_to_host()

    def rebuild(self, n_slots: int, n_live: int) -> None:
        """Re-lay the ``n_live`` live entries into ``n_slots`` (>= the current count) slots, dropping
        every tombstone, on the device: live keys and rows are gathered into device buffers (m rows
        of scratch), the slot arrays are cleared (or, to grow, new ones allocated first, so a failed
        allocation changes nothing) and the entries re-inserted. Nothing crosses to the host but
        counters. Blocking."""
        _, keys, rows = self._live(n_live)
        if n_slots != self.n_slots:
            self._set_slots(*self._alloc_slots(int(n_slots)))
        self.clear()
        n_new, _ = self.upsert(keys, rows, False)
        if n_new != n_live:
            raise InternalError(f"CUDA table rebuild re-inserted {n_new} of {n_live} keys (a bug)")

    def clear(self) -> None:
        K.clear[self._grid_rows(self.n_slots)](self.tkeys, self.tstate, self.tvals, self.owner)
        cuda.synchronize()
