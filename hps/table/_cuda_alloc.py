"""The fixed costs of a blocking CUDA table call that do not need the host: waiting for the producer of
its device inputs, allocating its device outputs, and finding the CUDA context (``_cuda.CudaTableImpl``).

- :func:`follow_producer`: a device input that names the stream its producer wrote it on (CUDA Array
  Interface v3, ``stream``) is ordered before the call by an event the call's stream waits on, on
  the device, instead of the host synchronising the producer's stream first (Numba's
  ``as_cuda_array(sync=True)``); nothing at all when both are the same stream (a CuPy array made on
  the legacy default stream, read by a call on stream 0). The call still ends by synchronising its
  own stream, so its results are there when it returns. The event is the table's own, recorded
  again by each call (a wait already enqueued keeps the record it saw), not one created per call.
- :func:`scope`: every public Numba CUDA call (``as_cuda_array``, ``copy_to_host``, a launch, ...)
  looks the current context up on its own, two driver queries and a lock when no outer call holds
  it; a blocking table call holds one lookup for all of its steps (Numba's ``ensure_context``).
- :class:`DeviceAlloc`: a blocking call's new device outputs come from CuPy's memory pool when CuPy
  is installed (a pooled block: no ``cuMemAlloc`` per call, nor the ``cuMemFree`` that synchronises
  the device when Numba later frees its own allocations), as a Numba view that keeps the CuPy
  array alive; from Numba's allocator otherwise (no CuPy, Numba's CUDA simulator). The block is
  recycled on the stream CuPy's current stream was when it was allocated; the call writes it on
  its own stream and synchronises that stream before returning, so no write is pending when the
  caller drops it. Its :meth:`~DeviceAlloc.to_device` copies a small host array into such a block on
  the call's stream, and :meth:`~DeviceAlloc.key_order` sorts an eviction's victims by key with
  CuPy's sort (the host sorted them, and gathered their rows again, before: 0.8 s of a 2 M-example
  H200 job's 7.3-s prepare stage at a tenth-of-the-table HBM budget).

Not thread-safe on their own; :class:`hps.HashTable` serialises calls.
"""

from __future__ import annotations

import contextlib

from .. import _launch as L
from .._xp import simulated

__all__ = ["DeviceAlloc", "blocking_view", "follow_producer", "scope"]

#: CUDA's handles of the default streams (``CU_STREAM_LEGACY``, ``CU_STREAM_PER_THREAD``).
LEGACY, PER_THREAD = 1, 2


def _handle(stream) -> int:
    """The driver handle a stream (``L.stream_of`` form) stands for; 0 (Numba's default stream)
    becomes the default stream Numba launches on (legacy unless per-thread is configured)."""
    h = 0 if stream == 0 else int(stream)
    if h == 0:
        from numba import config

        return PER_THREAD if config.CUDA_PER_THREAD_DEFAULT_STREAM else LEGACY
    return h


def follow_producer(d, stream, ev) -> None:
    """Make ``stream`` (``L.stream_of`` form) wait, on the device, for the stream the device array
    ``d`` was exported on (``d.stream``; 0 or absent: the producer named none, nothing to order),
    through the caller's event ``ev`` (``L.event()``). Does not block the host."""
    prod = getattr(d, "stream", 0)
    if prod == 0 or prod is None or _handle(prod) == _handle(stream):
        return
    ev.record(prod)
    ev.wait(stream)


def blocking_view(x, stream, ev):
    """A Numba view of a blocking call's array ``x`` (None for a host array), ``stream`` (``L.stream_of``
    form) made to wait for the stream its producer exported (:func:`follow_producer`, event ``ev``)."""
    d = L.view(x)
    if d is not None:
        follow_producer(d, L.stream_of(stream), ev)
    return d


def scope():
    """A context manager that looks the CUDA context up once for the Numba calls inside it (module
    docstring); a no-op under the simulator, which has no contexts."""
    runtime = None if simulated() else getattr(_devices(), "_runtime", None)
    return contextlib.nullcontext() if runtime is None else runtime.ensure_context()


def _devices():
    from numba.cuda.cudadrv import devices

    return devices


class DeviceAlloc:
    """New device arrays for the results of blocking calls (module docstring), on the current CUDA
    device (where the table was made)."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.cp, self.device = None, None
        if not simulated():
            try:
                import cupy
            except ImportError:
                return
            self.cp, self.device = cupy, cuda.get_current_device().id

    def empty(self, shape, dtype):
        """An uninitialised device array (a Numba device array) of ``shape`` and ``dtype``."""
        if self.cp is None or not _size(shape):
            return self.cuda.device_array(shape, dtype=dtype)
        with self.cp.cuda.Device(self.device):
            return self.cuda.as_cuda_array(self.cp.empty(shape, dtype), sync=False)

    def to_device(self, host, stream):
        """A device copy of the small host array ``host`` in a new array (:meth:`empty`), enqueued on
        ``stream`` (``L.stream_of`` form): no ``cuMemAlloc``, no synchronising copy on the default stream."""
        d = self.empty(host.shape, host.dtype)
        if host.size:
            d.copy_to_device(host, stream=stream)
        return d

    def key_order(self, keys, slots, stream):
        """``(keys, slots)`` device arrays (k,), the uint64 ``keys`` distinct and ``slots`` beside them,
        sorted by key on the device (CuPy's sort), as new Numba views; None without CuPy (the caller
        sorts on the host). Waits for ``stream`` first and for the sort before it returns."""
        if self.cp is None or not keys.shape[0]:
            return None
        cp = self.cp
        L.synchronize(stream)
        with cp.cuda.Device(self.device):
            k = cp.asarray(keys)
            order = cp.argsort(k)
            k, s = k[order], cp.asarray(slots)[order]
            cp.cuda.get_current_stream().synchronize()
        return self.cuda.as_cuda_array(k, sync=False), self.cuda.as_cuda_array(s, sync=False)


def _size(shape) -> int:
    n = 1
    for s in (shape if isinstance(shape, tuple) else (shape,)):
        n *= int(s)
    return n
