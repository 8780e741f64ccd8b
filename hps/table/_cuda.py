"""CUDA backend of :class:`hps.HashTable`: owns the device slot arrays, launches ``_cuda_kernels``.

The host object owns all table memory (slots, rows, the per-slot ``owner`` scratch, the counters),
allocated once at construction (growth re-allocates the slots); kernels get non-owning views and never
allocate. Launches go through ``hps._launch`` (grid-stride grids sized to the device, cached launch
configurations).

Streams (HierarchicalKV's and cuCollections' rule: launch on the caller's stream, synchronise at the
edge): every operation takes a ``stream`` (0 / a Numba stream / a CuPy stream). ``*_async`` methods
enqueue and return; the others end by synchronising that stream only, never the whole device. The
table's operations are kept in issue order across streams: an operation on another stream than the
previous one first makes its stream wait for the previous one (an event), so the shared scratch
(``owner``, counters) is never used by two operations at once.

Counts of asynchronous operations (keys inserted, revived, failed, erased) are added on the device to
``pending`` and read by :meth:`CudaTableImpl.settle` (the front's next blocking call).

Host inputs of blocking calls are copied into grow-only scratch buffers (no allocation per call once
warm); asynchronous calls take device arrays only. Results are device arrays when the caller's keys
were on the device (from CuPy's pool when CuPy is installed), NumPy arrays otherwise. A blocking
call's device inputs are ordered after their producer's stream on the device, not by a host wait
(``_cuda_alloc``); its one host wait is its own stream's, at the end. A blocking lookup copies nothing
back: its sentinel flag ``hit`` is mapped host memory, read after that wait, 0 between calls (the host
zeroes it after a lookup that raised or was interrupted); asynchronous lookups flag into ``_ahit``.

Not thread-safe on its own; :class:`hps.HashTable` serialises calls.
"""

from __future__ import annotations

import numpy as np

from .. import _launch as L
from .._keys import as_keys, check_rows, packed
from .._xp import simulated
from ..errors import DeviceUnavailableError, InternalError, InvalidInputError, InvalidTypeError
from ._cuda_alloc import DeviceAlloc, blocking_view, scope

try:
    from . import _cache_kernels_cuda as C
    from . import _cuda_kernels as K
except Exception:  # numba-cuda missing or broken: reported at construction (_launch.cuda)
    K = None

#: ``owner`` scratch is int32: a batch may hold at most this many keys.
MAX_BATCH = 2**31 - 1
#: ``pending`` counters of asynchronous calls: keys new, revived, failed (sentinel), erased.
PENDING = ("new", "revived", "failed", "erased")


def _require_gpu():
    """numba.cuda, after checking it reaches a GPU (or runs the simulator); else DeviceUnavailableError."""
    cuda = L.cuda("device='cuda'")
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
    return cuda


class CudaTableImpl:
    """Slot arrays on the current CUDA device; the interface of :class:`hps.table._cpu.CpuTableImpl`.

    Device arrays: ``tkeys`` (S,) uint64, ``tstate`` (S,) int32, ``tvals`` (S, dim) dtype, ``tscore``
    (S,) uint64 cache scores (``_cache.py``), ``owner`` (S,) int32 scratch (-1 between calls), ``counts`` (3,) int64 (one blocking call's), ``pending``
    (4,) int64 (asynchronous calls', see ``PENDING``), ``hit`` (1,) int64 mapped (sentinel seen).
    """

    device = "cuda"

    def __init__(self, n_slots: int, dim: int, dtype):
        self.cuda = _require_gpu()
        self.dim = int(dim)
        self.dtype = np.dtype(dtype)
        self._set_slots(*self._alloc_slots(int(n_slots)))
        cuda = self.cuda
        self.alloc = DeviceAlloc(cuda)  # results of blocking calls
        self.counts = cuda.device_array(3, dtype=np.int64)
        self.pending = cuda.device_array(len(PENDING), dtype=np.int64)
        self.hit, self._ahit = cuda.mapped_array(1, dtype=np.int64), cuda.device_array(1, dtype=np.int64)
        self._h_counts = cuda.pinned_array(len(PENDING), dtype=np.int64)
        self._h_zeros = cuda.pinned_array(len(PENDING), dtype=np.int64)
        self._h_zeros[:] = 0
        self._scratch: dict = {}
        self._last = 0  # stream of the last operation (see the module docstring)
        self._ev = L.event()  # orders streams (``enter``, ``follow_producer``), re-recorded each time
        self._hit_dirty = True  # ``hit`` may be non-zero (module docstring): uninitialised here
        self.pending.copy_to_device(self._h_zeros)
        self.clear()

    def _alloc_slots(self, n_slots: int):
        """New (uninitialised) slot arrays: tkeys (S,) uint64, tstate (S,) int32, tvals (S, dim), tscore
        (S,) uint64, owner (S,) int32. Raises (CUDA out of memory) before anything of the table changed."""
        cuda = self.cuda
        return (cuda.device_array(n_slots, dtype=np.uint64), cuda.device_array(n_slots, dtype=np.int32),
                cuda.device_array((n_slots, self.dim), dtype=self.dtype),
                cuda.device_array(n_slots, dtype=np.uint64), cuda.device_array(n_slots, dtype=np.int32))

    def _set_slots(self, tkeys, tstate, tvals, tscore, owner) -> None:
        self.tkeys, self.tstate, self.tvals, self.tscore, self.owner = tkeys, tstate, tvals, tscore, owner
        self.n_slots = tkeys.shape[0]

    # -- streams -------------------------------------------------------------------------------
    def enter(self, stream):
        """The Numba stream of ``stream``, made to wait for the table's previous operation when that
        ran on another stream (operations stay in issue order)."""
        s = L.stream_of(stream)
        if s is not self._last and s != self._last:
            self._ev.record(self._last)
            self._ev.wait(s)
            self._last = s
        return s

    #: One CUDA context lookup for a whole blocking call (``_cuda_alloc.scope``).
    scope = staticmethod(scope)

    def sync(self, s) -> None:
        L.synchronize(s)

    def _zero(self, arr, s) -> None:
        arr.copy_to_device(self._h_zeros[:arr.shape[0]], stream=s)

    def _read(self, arr, s) -> np.ndarray:
        """Host copy of a small counter array; blocks until ``s`` reaches it."""
        out = self._h_counts[:arr.shape[0]]
        arr.copy_to_host(out, stream=s)
        self.sync(s)
        return out

    # -- input conversion -------------------------------------------------------------------------
    def _buf(self, name: str, shape, dtype):
        """Grow-only scratch of at least ``shape`` (first axis), viewed to ``shape``; blocking calls only."""
        b = self._scratch.get(name)
        if b is None or b.shape[0] < shape[0] or b.shape[1:] != tuple(shape[1:]) or b.dtype != dtype:
            b = self._scratch[name] = self.cuda.device_array((max(1, shape[0]),) + tuple(shape[1:]), dtype=dtype)
        return b[:shape[0]]

    def keys_in(self, keys, name="keys", stream=0, blocking=True):
        """(device keys (n,) uint64, on_device). Host keys (blocking calls only) are validated, then
        copied into scratch; device keys are used in place (int64 reinterpreted bitwise). A blocking
        call's ``stream`` first waits (on the device) for the stream the producer exported."""
        d = blocking_view(keys, stream, self._ev) if blocking else _async_view(keys)
        if d is None:
            if not blocking:
                raise InvalidTypeError(f"{name} must be a device array for an asynchronous call; "
                                       "use the blocking call for host arrays")
            k = as_keys(keys, name)
            self._check_batch(k.shape[0], name)
            buf = self._buf("keys", k.shape, np.uint64)
            if k.shape[0]:
                buf.copy_to_device(k, stream=L.stream_of(stream))
            return buf, False
        if d.ndim != 1:
            raise InvalidInputError(f"{name} must be 1-D (n,), got shape {d.shape}")
        if d.dtype == np.int64:
            d = d.view(np.uint64)
        elif d.dtype != np.uint64:
            if d.shape[0] == 0:
                return self.cuda.device_array(0, dtype=np.uint64), True
            raise InvalidTypeError(f"{name} must be uint64 (or int64, reinterpreted bitwise), got {d.dtype}")
        self._check_batch(d.shape[0], name)
        return d, True

    def check_sentinel(self, keys, name="keys", stream=0) -> None:
        """Raise InvalidInputError when device ``keys`` hold the sentinel. Blocking."""
        self._checked(keys, lambda s: L.launch(K.has_key, L.grid1(keys.shape[0]), s, keys,
                                               np.uint64(0xFFFFFFFFFFFFFFFF), self.hit), stream, name)

    @staticmethod
    def _check_batch(n: int, name: str) -> None:
        if n > MAX_BATCH:
            raise InvalidInputError(f"{name} holds {n} keys; device='cuda' takes at most {MAX_BATCH} per call")

    def rows_in(self, rows, n, name="values", stream=0, blocking=True):
        """Device rows (n, dim) of the table dtype. Host rows (blocking calls only) are validated (and
        cast like ``check_rows``) then copied into scratch; device rows of the right dtype are used in
        place, other numeric dtypes are converted on the GPU into a new array."""
        d = blocking_view(rows, stream, self._ev) if blocking else _async_view(rows)
        if d is None:
            if not blocking:
                raise InvalidTypeError(f"{name} must be a device array for an asynchronous call")
            r = packed(check_rows(rows, n, self.dim, self.dtype, name))
            buf = self._buf("rows", r.shape, self.dtype)
            if n:
                buf.copy_to_device(r, stream=L.stream_of(stream))
            return buf
        if tuple(d.shape) != (n, self.dim):
            raise InvalidInputError(
                f"{name} must have shape ({n}, {self.dim}) to match the keys and dim, got {tuple(d.shape)}")
        if d.dtype == self.dtype:
            return d
        if d.dtype.kind not in "fiub":
            raise InvalidTypeError(f"{name} must be numeric ({self.dtype}), got {d.dtype}")
        out = self.cuda.device_array((n, self.dim), dtype=self.dtype)  # an async call may still read it
        if n:
            L.launch(K.cast_rows, L.grid_rows(n, self.dim), L.stream_of(stream), d, out)
        return out

    def empty(self, name, shape, dtype, on_device):
        """An output array: a new device array for a device caller, else scratch ``name`` (blocking)."""
        return self.alloc.empty(shape, dtype) if on_device else self._buf(name, shape, dtype)

    def device_out(self, a):
        """``a`` as an output of an asynchronous call: a zero-copy device view."""
        d = _async_view(a)
        if d is None:
            raise InvalidTypeError(f"outputs of an asynchronous call are device arrays, got {type(a).__name__}")
        return d

    def out(self, arr, on_device, stream=0):
        """``arr`` (a device array) as is when the caller's inputs were on the device, else on the host
        (a copy; the scratch ``arr`` is reused by the next call)."""
        return arr if on_device else arr.copy_to_host(stream=L.stream_of(stream))

    # -- asynchronous operations (validated device inputs) -------------------------------------------
    def upsert_async(self, keys, rows, accumulate: bool, stream=0, counts=None) -> None:
        """Claim or find each key's slot, then add or assign its row (the last duplicate wins);
        ``counts`` (default ``pending``) += (n_new, n_revived, n_failed). REQUIRES: room for every key."""
        n = keys.shape[0]
        if n == 0:
            return
        s = self.enter(stream)
        counts = self.pending if counts is None else counts
        accumulate = bool(accumulate)
        L.launch(K.upsert_claim, L.grid1(n), s, self.tkeys, self.tstate, self.owner, keys, not accumulate, counts)
        L.launch(K.upsert_rows, L.grid_rows(n, self.dim), s, self.tkeys, self.tvals, self.owner, keys, rows,
                 accumulate)
        if not accumulate:
            L.launch(K.unmark_keys, L.grid1(n), s, self.tkeys, self.owner, keys)

    def get_async(self, keys, out, found, stream=0, hit=None) -> None:
        """out (n, dim) = rows of live keys, zeros elsewhere; found (n,) bool; a sentinel key sets ``hit``
        (default ``_ahit``, never read)."""
        if keys.shape[0]:
            L.launch(K.get, L.grid1(keys.shape[0]), self.enter(stream), self.tkeys, self.tstate, self.tvals, keys,
                     out, found, self._ahit if hit is None else hit)

    def contains_async(self, keys, found, stream=0, hit=None) -> None:
        if keys.shape[0]:
            L.launch(K.contains, L.grid1(keys.shape[0]), self.enter(stream), self.tkeys, self.tstate, keys, found,
                     self._ahit if hit is None else hit)

    def erase_async(self, keys, stream=0, counts=None) -> None:
        """Erase live keys; ``counts[0]`` (default ``pending["erased"]``) += keys erased."""
        if keys.shape[0]:
            counts = self.pending[3:4] if counts is None else counts
            L.launch(K.erase, L.grid1(keys.shape[0]), self.enter(stream), self.tkeys, self.tstate, self.tvals,
                     self.tscore, keys, counts)

    def lookup_async(self, keys, batch: int, slots, stream=0) -> None:
        """slots (n,) int64 = each live key's slot (-1 elsewhere); live keys' scores count a use in
        ``batch`` (``_cache.py``)."""
        if keys.shape[0]:
            L.launch(C.lookup, L.grid1(keys.shape[0]), self.enter(stream), self.tkeys, self.tstate, self.tscore,
                     keys, np.uint64(batch), slots)

    def evict(self, n: int, protect: int, n_live: int, stream=0):
        """(keys (k,) uint64, rows (k, dim)) host arrays of the k <= n victims (``_cache.py``), in key
        order, erased from the table. Blocking."""
        from ._cache import in_key_order, victim_slots  # the radix select's host side

        s = self.enter(stream)
        slots = victim_slots(self, n, protect, n_live, s)
        k = slots.shape[0]
        keys, rows, by_key = self.alloc.empty(k, np.uint64), self.alloc.empty((k, self.dim), self.dtype), None
        if k:
            L.launch(K.gather_keys, L.grid1(k), s, self.tkeys, slots, keys)
            by_key = self.alloc.key_order(keys, slots, s)   # None without CuPy: sorted on the host below
            keys, slots = by_key or (keys, slots)
            L.launch(K.gather_rows, L.grid_rows(k, self.dim), s, self.tvals, slots, rows)
            L.launch(C.erase_slots, L.grid_rows(k, self.dim), s, self.tstate, self.tvals, self.tscore, slots)
        hk, hr = keys.copy_to_host(stream=s), rows.copy_to_host(stream=s)  # the one batched transfer
        self.sync(s)
        return (hk, hr) if by_key is not None else in_key_order(hk, hr)

    def settle(self) -> np.ndarray:
        """(4,) int64 host counts of the asynchronous calls since the last settle (``PENDING`` order),
        then zeroed. Blocking (waits for the stream of the last operation)."""
        s = self._last
        got = self._read(self.pending, s).copy()
        self._zero(self.pending, s)
        return got

    # -- blocking operations (validated device inputs) ------------------------------------------------
    def upsert(self, keys, rows, accumulate: bool, stream=0):
        """-> (n_new, n_revived). REQUIRES: room for every key (see HashTable._upsert)."""
        if keys.shape[0] == 0:
            return 0, 0
        s = self.enter(stream)
        self._zero(self.counts, s)
        self.upsert_async(keys, rows, accumulate, s, self.counts)
        c = self._read(self.counts, s)
        return int(c[0]), int(c[1])

    def claim(self, keys, stream=0):
        """-> (slots (n,) int64, is_new (n,) int8, n_new, n_revived, n_failed); device arrays."""
        n = keys.shape[0]
        slots, is_new = self.alloc.empty(n, np.int64), self.alloc.empty(n, np.int8)
        if n == 0:
            return slots, is_new, 0, 0, 0
        s = self.enter(stream)
        self._zero(self.counts, s)
        L.launch(K.claim, L.grid1(n), s, self.tkeys, self.tstate, keys, slots, is_new, self.counts)
        c = self._read(self.counts, s)
        return slots, is_new, int(c[0]), int(c[1]), int(c[2])

    def rollback(self, slots, is_new, stream=0) -> None:
        n = slots.shape[0]
        if n:
            s = self.enter(stream)
            L.launch(K.rollback, L.grid1(n), s, self.tkeys, self.tstate, slots, is_new)
            self.sync(s)

    def write(self, slots, rows, accumulate: bool, stream=0) -> None:
        n = slots.shape[0]
        if n == 0:
            return
        s = self.enter(stream)
        accumulate = bool(accumulate)
        if not accumulate:
            L.launch(K.mark_slots, L.grid1(n), s, self.owner, slots)
        L.launch(K.write_rows, L.grid_rows(n, self.dim), s, self.tvals, self.owner, slots, rows, accumulate)
        if not accumulate:
            L.launch(K.unmark_slots, L.grid1(n), s, self.owner, slots)
        self.sync(s)

    def get(self, keys, out=None, on_device=True, stream=0):
        """(out (n, dim), found (n,)) device arrays (scratch when the keys came from the host); raises
        InvalidInputError on the sentinel key. Blocking."""
        n = keys.shape[0]
        dev_out = None if out is None else L.view(out)
        if dev_out is None:  # a host ``out`` is filled by the front
            out = self.empty("out", (n, self.dim), self.dtype, on_device)
        else:
            out = dev_out
            if out.shape != (n, self.dim) or out.dtype != self.dtype:
                raise InvalidInputError(f"out must have shape {(n, self.dim)} and dtype {self.dtype}, "
                                        f"got {out.shape} {out.dtype}")
        found = self.empty("found", (n,), np.bool_, on_device)
        self._checked(keys, lambda s: self.get_async(keys, out, found, s, self.hit), stream)
        return out, found

    def contains(self, keys, on_device=True, stream=0):
        n = keys.shape[0]
        found = self.empty("found", (n,), np.bool_, on_device)
        self._checked(keys, lambda s: self.contains_async(keys, found, s, self.hit), stream)
        return found

    def _checked(self, keys, run, stream, name="keys") -> None:
        """Run a lookup that flags the sentinel in ``hit``, wait for it, raise if it was flagged. A dirty
        ``hit`` (module docstring) is zeroed by the host once no launch can still write it."""
        if keys.shape[0]:
            s = self.enter(stream)
            if self._hit_dirty:
                self.sync(s)  # ``s`` waits for the table's previous operation (``enter``)
                self.hit[0] = 0
            self._hit_dirty = True
            run(s)
            self.sync(s)
            if self.hit[0]:
                raise _sentinel_error(name)
            self._hit_dirty = False

    def erase(self, keys, stream=0) -> int:
        if keys.shape[0] == 0:
            return 0
        s = self.enter(stream)
        self._zero(self.counts, s)
        self.erase_async(keys, s, self.counts)
        return int(self._read(self.counts, s)[0])

    def _live(self, n_live: int, rows: bool = True):
        """Device (live slots (m,) int64, their keys (m,) uint64, their rows (m, dim) (without ``rows``:
        None, none gathered), their scores (m,) uint64), m = n_live, the table's live-key count
        (kept by HashTable), checked against the kernel's count."""
        s = self.enter(0)
        scores, keys, slots = self.entries(n_live, 2**32, s)
        found = int(self._read(self.counts, s)[0])
        if found != n_live:
            raise InternalError(f"CUDA table holds {found} live keys but its host counts {n_live} (a bug)")
        out = self.cuda.device_array((n_live, self.dim), dtype=self.dtype) if rows else None
        if n_live and rows:
            L.launch(K.gather_rows, L.grid_rows(n_live, self.dim), s, self.tvals, slots, out)
        return slots, keys, out, scores

    def entries(self, n_live: int, protect: int, s):
        """Device (scores (n_live,) uint64, keys, slots int64) of the live slots last used before batch
        ``protect`` (2**32: all), compacted in no particular order; their number lands in counts[0]."""
        out = (self.alloc.empty(n_live, np.uint64), self.alloc.empty(n_live, np.uint64),
               self.alloc.empty(n_live, np.int64))
        self._zero(self.counts, s)
        L.launch(K.live_entries, L.grid1(self.n_slots), s, self.tkeys, self.tstate, self.tscore, np.uint64(protect),
                 *out, self.counts)
        return out

    def export(self, n_live: int):
        """(keys (m,) uint64, values (m, dim)) host arrays of the ``n_live`` live entries, in no
        particular order. Only the live keys and rows cross to the host, not the slot arrays."""
        _, keys, rows, _ = self._live(n_live)
        return keys.copy_to_host(), rows.copy_to_host()

    def live_keys(self, n_live: int) -> np.ndarray:
        """(m,) uint64 host array of the ``n_live`` live keys, in no particular order (no row gathered)."""
        return self._live(n_live, rows=False)[1].copy_to_host()

    def rebuild(self, n_slots: int, n_live: int) -> None:
        """Re-lay the ``n_live`` live entries into ``n_slots`` (>= the current count) slots, dropping
        every tombstone, on the device: live keys and rows are gathered into device buffers (m rows
        of scratch), the slot arrays are cleared (or, to grow, new ones allocated first, so a failed
        allocation changes nothing) and the entries re-inserted. Nothing crosses to the host but
        counters. Blocking."""
        _, keys, rows, scores = self._live(n_live)
        if n_slots != self.n_slots:
            self._set_slots(*self._alloc_slots(int(n_slots)))
        self.clear()
        n_new, _ = self.upsert(keys, rows, False)
        if n_new != n_live:
            raise InternalError(f"CUDA table rebuild re-inserted {n_new} of {n_live} keys (a bug)")
        if n_live:
            L.launch(C.set_scores, L.grid1(n_live), self.enter(0), self.tkeys, self.tscore, keys, scores)

    def clear(self) -> None:
        s = self.enter(0)
        L.launch(K.clear, L.grid_rows(self.n_slots, self.dim), s, self.tkeys, self.tstate, self.tvals, self.tscore,
                 self.owner)
        self.sync(s)


def _async_view(x):
    """A device view of an asynchronous call's array; under the CUDA simulator a NumPy array stands for
    a device array (the seam of ``hps._xp``), as in ``hps.gpu``'s operations."""
    d = L.view(x)
    if d is None and isinstance(x, np.ndarray) and simulated():
        return x
    return d


def _sentinel_error(name: str) -> InvalidInputError:
    return InvalidInputError(f"{name} contains the reserved sentinel key 2**64-1 (-1 as int64), which marks "
                             "empty slots; remap it before calling")
