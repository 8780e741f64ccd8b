"""``TransferLedger``: the one helper every host <-> device copy of the training path goes through.

It copies and counts: bytes by direction and purpose, plus how many mini-batches ran, so a run can
show that no row, key or gradient crosses PCIe inside the mini-batch loop (docs/gpu.md, "The transfer ledger").

Purposes (``PURPOSES``; metrics keys, so never renamed):

- ``plan``       a batch's inputs going up once: with keys deduplicated on the device, its raw arrays
                 (keys, field, weights, offsets, labels, dense) in the prepare stage and the misses
                 coming down (8 B a key); otherwise its plans in the place stage (unique keys, inverse,
                 offsets, labels, dense) and the working set's residency lookup (keys up, misses down);
- ``fetch``      rows entering the HBM-PS (from the MEM-PS / SSD-PS / other ranks), with their keys
                 unless the residency lookup left them on the device (one table inserting its misses);
- ``writeback``  rows leaving the HBM-PS (evictions, checkpoints, eval lookups), with the keys that
                 look them up or erase them and the found flags;
- ``mpi``        host staging for MPI when it is not CUDA-aware (0 with CUDA-aware MPI);
- ``minibatch``  everything else inside the mini-batch loop: scalars only (at most 16 bytes a mini-batch).

Besides the copies it counts the batches staged (:meth:`batch`): ``batch_bytes``, their raw arrays'
bytes (``hps.data.Batch``), the denominator of "everything the host uploads but rows, per raw byte"
(``(sum(h2d_bytes) - h2d_bytes["fetch"]) / batch_bytes``), and ``device_dedup_batches``, those whose keys
were deduplicated on the device.

Copies between two GPUs of one process (HBM-PS parts on several GPUs, ``Placement.peer``) do not
cross the host; they are counted apart, as ``peer_bytes``.

Device arrays are those of the ledger's array module ``xp`` (``hps._xp.array_module``): CuPy on a GPU,
NumPy under the CUDA simulator, where a NumPy array stands for a device array and a "copy" is a NumPy
copy, counted exactly as the real one would be. :meth:`to_host` also takes Numba device arrays (the
HBM-PS table's outputs, the simulator's arrays).

Thread-safe: the place stage uploads while the train stage downloads; counters are guarded by a lock.
"""

from __future__ import annotations

import threading

import numpy as np

from ..errors import InvalidInputError, InvalidTypeError

__all__ = ["TransferLedger", "PURPOSES", "transfer_metrics"]

#: Purposes of a copy, in the order metrics list them. Metrics keys: never rename.
PURPOSES = ("plan", "fetch", "writeback", "mpi", "minibatch")


def _is_cupy(a) -> bool:
    return type(a).__module__.split(".")[0] == "cupy"


class TransferLedger:
    """Copies between host and device, counted by purpose.

    Args:
        xp: the device's array module (``hps._xp.array_module(device)``): ``cupy``, or ``numpy`` on a
            simulated GPU (and for host-only runs, where every count stays 0 because nothing is copied).
    """

    def __init__(self, xp=np):
        self.xp = xp
        self._lock = threading.Lock()
        self._h2d = dict.fromkeys(PURPOSES, 0)
        self._d2h = dict.fromkeys(PURPOSES, 0)
        self._minibatches = 0
        self._peer = 0
        self._batch_bytes = 0
        self._dedup_batches = 0

    @staticmethod
    def _check(purpose: str) -> None:
        if purpose not in PURPOSES:
            raise InvalidInputError(f"transfer purpose must be one of {PURPOSES}, got {purpose!r}")

    def _count(self, table: dict, purpose: str, nbytes: int) -> None:
        with self._lock:
            table[purpose] += int(nbytes)

    # -- copies ----------------------------------------------------------------------------------------
    def to_device(self, host, purpose: str, stream=None):
        """Device copy (an ``xp`` array) of the host array ``host``; counts its bytes as h2d ``purpose``.

        ``stream``: a CuPy stream to copy on (asynchronous w.r.t. the host when ``host`` is pinned);
        default the current stream. On a simulated GPU the copy is a NumPy copy (synchronous)."""
        self._check(purpose)
        if hasattr(host, "__cuda_array_interface__") or getattr(host, "__cuda_ndarray__", False):
            raise InvalidTypeError(f"to_device({purpose!r}) got a device array ({type(host).__name__}); "
                                   "it takes host NumPy arrays")
        a = np.ascontiguousarray(host)
        self._count(self._h2d, purpose, a.nbytes)
        if self.xp is np:
            return a.copy()
        if stream is None:
            return self.xp.asarray(a)
        with stream:
            return self.xp.asarray(a)

    def to_host(self, dev, purpose: str, out=None, stream=None) -> np.ndarray:
        """Host copy of the device array ``dev`` (CuPy, Numba device array, or on a simulated GPU a
        NumPy array); counts its bytes as d2h ``purpose``. ``out``: a host array of the same shape and
        dtype to fill (pinned memory for an asynchronous copy). ``stream``: the stream to copy on
        (CuPy or Numba, matching ``dev``); the copy is complete when this returns unless ``out`` is
        pinned and a stream is given (then synchronise the stream before reading ``out``)."""
        self._check(purpose)
        if _is_cupy(dev):
            host = dev.get(stream=stream, out=out)
        elif getattr(dev, "__cuda_ndarray__", False) or hasattr(dev, "__cuda_array_interface__"):
            if not getattr(dev, "__cuda_ndarray__", False):
                from numba import cuda

                dev = cuda.as_cuda_array(dev)
            host = dev.copy_to_host(out, stream=0 if stream is None else stream)
        elif isinstance(dev, np.ndarray) and self.xp is np:
            if out is None:
                host = dev.copy()
            else:
                np.copyto(out, dev)
                host = out
        else:
            raise InvalidTypeError(f"to_host({purpose!r}) needs a device array, got {type(dev).__name__}")
        self._count(self._d2h, purpose, host.nbytes)
        return host

    def record(self, direction: str, purpose: str, nbytes: int) -> None:
        """Count a copy another component makes on the training path's behalf (``direction`` "h2d" or
        "d2h"): the parts of a ``PartitionedHashTable`` upload their own shares of a host batch."""
        self._check(purpose)
        if direction not in ("h2d", "d2h"):
            raise InvalidInputError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
        self._count(self._h2d if direction == "h2d" else self._d2h, purpose, nbytes)

    def peer(self, nbytes: int) -> None:
        """Count a device-to-device copy of ``nbytes`` (``Placement.peer`` makes it)."""
        with self._lock:
            self._peer += int(nbytes)

    # -- mini-batches and metrics ------------------------------------------------------------------
    def minibatch(self) -> None:
        """Count one mini-batch (the train stage calls it once per mini-batch)."""
        with self._lock:
            self._minibatches += 1

    def batch(self, nbytes: int, on_device: bool) -> None:
        """Count one batch staged for the step: ``nbytes`` its raw arrays' bytes; ``on_device``: its keys
        were deduplicated on the device (its raw arrays went up, not its plans)."""
        with self._lock:
            self._batch_bytes += int(nbytes)
            self._dedup_batches += bool(on_device)

    def metrics(self) -> dict:
        """``{"h2d_bytes": {purpose: int}, "d2h_bytes": {purpose: int}, "peer_bytes": int,
        "minibatches": int, "batch_bytes": int, "device_dedup_batches": int}``, every purpose of
        ``PURPOSES`` present (0 when nothing of it crossed)."""
        with self._lock:
            return {"h2d_bytes": dict(self._h2d), "d2h_bytes": dict(self._d2h), "peer_bytes": self._peer,
                    "minibatches": self._minibatches, "batch_bytes": self._batch_bytes,
                    "device_dedup_batches": self._dedup_batches}


def transfer_metrics(per_rank: list) -> dict:
    """``h2d_bytes`` / ``d2h_bytes`` (purpose -> bytes, summed over ranks), ``peer_bytes`` (between
    the GPUs of a rank, summed), ``minibatches`` (rank 0's count: every rank runs every global
    mini-batch), ``batch_bytes`` and ``device_dedup_batches`` (the batches staged: raw bytes, and how
    many had their keys deduplicated on the device; summed) and ``gpu_paths`` (rank 0's, None on the CPU:
    how the host drove the GPU, ``DeviceBackend.transfers``) from the ledgers' ``metrics()`` of every
    rank (None for a rank on the CPU: zeros)."""
    zero = TransferLedger().metrics()
    per = [m or zero for m in per_rank]
    return {"h2d_bytes": {k: sum(m["h2d_bytes"][k] for m in per) for k in PURPOSES},
            "d2h_bytes": {k: sum(m["d2h_bytes"][k] for m in per) for k in PURPOSES},
            "peer_bytes": sum(m["peer_bytes"] for m in per),
            "minibatches": per[0]["minibatches"],
            "batch_bytes": sum(m["batch_bytes"] for m in per),
            "device_dedup_batches": sum(m["device_dedup_batches"] for m in per),
            "gpu_paths": per[0].get("gpu_paths")}
