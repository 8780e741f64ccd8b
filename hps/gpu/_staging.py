"""``PinnedStaging``: host arrays go up to the device in one copy, through one pinned host buffer reused
across batches.

The ``--device cuda`` prepare stage hands it a batch's raw arrays (keys, field, weights, offsets,
labels, dense: ``hps.data.Batch``'s contract); it packs them back to back (each at an 8-byte aligned
offset) into its page-locked buffer, copies the packed bytes to one device allocation on the given
stream (asynchronous w.r.t. the host: the buffer is pinned) and returns device views of that
allocation, one per array, with the arrays' shapes and dtypes. The ledger counts the bytes copied
(the arrays' bytes plus at most 7 bytes of alignment each) under the caller's purpose.

The buffer grows (doubling) when a batch does not fit and is otherwise reused: before packing the next
batch into it, :meth:`PinnedStaging.upload` waits for the event of the previous copy, so a copy still
reading it is never overwritten (the ``--device cuda`` prepare stage waits for each upload anyway,
``hps.gpu.PlanStreams``, so there the wait finds the copy done; one buffer is enough). On a simulated GPU (``xp`` is NumPy) the buffer is a plain NumPy array
and the "device" allocation its NumPy copy, counted as the real one would be.

Not thread-safe: one caller thread (the prepare stage).
"""

from __future__ import annotations

import contextlib

import numpy as np

from ..errors import InvalidTypeError

__all__ = ["PinnedStaging", "index_dtype"]

#: Offsets of the packed arrays are multiples of this (the widest dtype a batch holds).
ALIGN = 8


def index_dtype(bound: int):
    """The smallest unsigned dtype holding every integer in [0, ``bound``] (uint8, uint16, uint32; int64
    past those): the dtype indices and fields go up in when they are not packed raw (the host path's
    plans, ``DeviceBackend.stage``), widened on the device."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if bound <= np.iinfo(dt).max:
            return dt
    return np.int64


class PinnedStaging:
    """See the module docstring. ``xp``: the device's array module (CuPy, or NumPy simulated);
    ``ledger``: the :class:`~hps.gpu.TransferLedger` counting the copies."""

    def __init__(self, xp, ledger):
        self.xp, self.ledger = xp, ledger
        self._host = np.empty(0, np.uint8)
        self._done = None        # the event of the last copy out of the buffer (CuPy)

    @property
    def capacity(self) -> int:
        """Bytes the host buffer holds now."""
        return int(self._host.shape[0])

    def upload(self, arrays, purpose: str, stream=None) -> list:
        """Device views (``xp`` arrays, each the shape and dtype of its input) of host ``arrays`` (NumPy,
        any shape; copied C-contiguous), in one copy of their packed bytes on ``stream`` (CuPy stream;
        None: the current one). Asynchronous on a GPU: the views are valid once ``stream`` reaches the
        copy (synchronise it, or wait on an event recorded after it, before another stream reads them);
        counted as h2d ``purpose``."""
        for a in arrays:
            if hasattr(a, "__cuda_array_interface__") or getattr(a, "__cuda_ndarray__", False):
                raise InvalidTypeError(f"upload takes host NumPy arrays, got {type(a).__name__}")
        arrays = [np.ascontiguousarray(a) for a in arrays]
        offsets, total = [], 0
        for a in arrays:
            offsets.append(total)
            total += -(-a.nbytes // ALIGN) * ALIGN
        self._reserve(total)
        for a, off in zip(arrays, offsets):
            self._host[off:off + a.nbytes] = a.reshape(-1).view(np.uint8)
        dev = self._copy(total, stream)
        self.ledger.record("h2d", purpose, total)
        return [dev[off:off + a.nbytes].view(a.dtype).reshape(a.shape) for a, off in zip(arrays, offsets)]

    def _reserve(self, total: int) -> None:
        """Wait for the last copy out of the buffer, then make the buffer hold ``total`` bytes."""
        if self._done is not None:
            self._done.synchronize()
            self._done = None
        if total <= self.capacity:
            return
        size = max(total, 2 * self.capacity)
        if self.xp is np:
            self._host = np.empty(size, np.uint8)
        else:
            import cupyx

            self._host = cupyx.empty_pinned((size,), np.uint8)

    def _copy(self, total: int, stream):
        if self.xp is np:
            return self._host[:total].copy()
        with stream if stream is not None else contextlib.nullcontext():
            dev = self.xp.empty(total, np.uint8)
            dev.set(self._host[:total], stream=stream)
            self._done = self.xp.cuda.get_current_stream().record()
        return dev
