"""Where a batch's keys are deduplicated: on the device when nothing needs them on the host, else on
the host (``_sync``). The prepare and place stages of ``Trainer`` go through :class:`BatchPlanner`.

**On the device** (:func:`dedups_on_device`: ``--device cuda`` (one HBM-PS table or parts), one rank and
no feature that reads a batch's keys on the host), per batch:

- prepare: the local batch's raw arrays (keys, field, weights, offsets, labels, dense) go up once,
  packed through a pinned staging buffer reused across batches, on a non-blocking stream of their
  own, so on the device the copy runs while the previous batches' kernels do (``DeviceBackend.upload``;
  the streams and events: ``hps.gpu.PlanStreams``); the batch's distinct keys are computed there
  (first-occurrence order: the host's working set) and handed to the hierarchy as :class:`DeviceKeys`,
  so the residency lookup uploads nothing and only the misses come down (8 B a key);
- place: each mini-batch's unique keys, inverse and rebased offsets are made on the device from slices
  of the uploaded arrays, all mini-batches in one pass over the batch (``DeviceBackend.stage_uploaded``
  with ``hps.gpu.minibatch_plans``, on the place stage's stream, after the upload's event; the train
  stage waits for the place stage's event): the mini-batches' bounds go up (``plan``, 8 (P + 1) bytes),
  and their offsets in the batch's distinct keys and gradient chunks come down (``plan``, 16 (P + 1)). The
  plans equal the host's (the host's key order), so ``--device cuda`` still equals ``cpu``.

**On the host** otherwise: ``sync.plan`` computes every mini-batch's unique keys and inverse (and with
several ranks exchanges them with their owners), and the place stage uploads those plans
(``Backend.stage``: indices and fields in the smallest dtype that holds them). On ``--device cuda``
the working set goes up once in the prepare stage (:class:`WorkingSet`; the residency lookup reuses
that copy, partitioned on the device with HBM-PS parts) and each mini-batch's keys go up as their
positions in it.

Which features read a batch's keys on the host (``Feature.needs_host_keys``): admission and expiry
(``_admission``: every batch's keys are touched in the prepare stage, its known keys and their last
use), FAE (``_fae``: a mini-batch's keys are divided into hot and cold on the host). Admission's key
rewriting (``on_prepare``) happens before the upload and needs nothing. HET with one rank runs the BSP
step (nothing cached), and the sparse syncs' exchange of keys (several ranks) is the host path.

Thread safety: :meth:`BatchPlanner.plan` runs in the prepare thread, :meth:`BatchPlanner.stage` in
the place thread.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._sync import Plan

__all__ = ["BatchPlanner", "DeviceBatch", "DeviceKeys", "WorkingSet", "dedups_on_device", "raw_nbytes"]


@dataclass
class DeviceKeys:
    """Distinct keys (u,) uint64 already on the device (an ``xp`` array): a working set the HBM-PS's
    residency lookup takes without an upload (``LedgerTable.missing``)."""

    keys: object

    @property
    def shape(self):
        return self.keys.shape


@dataclass
class DeviceBatch:
    """A local batch's raw arrays on the device (``DeviceBackend.upload``), ``xp`` arrays as
    ``hps.data.Batch`` holds them (``keys`` (nnz,) uint64, ``field`` (nnz,) int32, ``weights`` (nnz,),
    ``offsets`` (n + 1,) int64, ``labels`` (n,), ``dense`` (n, n_dense) or None without dense
    features; floats in the model's dtype); ``host_offsets`` the host's ``offsets`` (mini-batch slices
    are cut without a read back); ``working_set`` the batch's distinct keys in first-occurrence order;
    ``uploaded`` the event recorded on the upload stream after all of them (``hps.gpu.PlanStreams``;
    None without streams)."""

    keys: object
    field: object
    weights: object
    offsets: object
    labels: object
    dense: object
    host_offsets: np.ndarray
    working_set: DeviceKeys
    uploaded: object = None


@dataclass
class WorkingSet:
    """A host-path batch's working set (``sync.plan``'s resident keys, ``host`` (u,) uint64) and its
    device copy ``dev`` (``DeviceBackend.upload_working_set``; the residency lookup reuses it), which
    the place stage gathers every mini-batch's keys from (:meth:`index`); ``uploaded`` the event after
    the copy (None without streams)."""

    host: np.ndarray
    dev: object
    uploaded: object = None
    _sorted: tuple | None = None

    def index(self, keys: np.ndarray):
        """Positions (n,) int64 in ``host`` of ``keys`` (n,) uint64, or None when one is not there."""
        if self._sorted is None:
            order = np.argsort(self.host, kind="stable")
            self._sorted = (order, self.host[order])
        order, sk = self._sorted
        pos = np.minimum(np.searchsorted(sk, keys), max(sk.shape[0] - 1, 0))
        if keys.shape[0] and (sk.shape[0] == 0 or not np.array_equal(sk[pos], keys)):
            return None
        return order[pos] if keys.shape[0] else np.zeros(0, np.int64)


def raw_nbytes(batch) -> int:
    """Bytes of a ``hps.data.Batch``'s arrays (keys, field, weights, offsets, labels, dense)."""
    return int(sum(a.nbytes for a in (batch.keys, batch.field, batch.weights, batch.offsets, batch.labels,
                                       batch.dense)))


def dedups_on_device(backend, features, ranks: int) -> bool:
    """Whether a job deduplicates its batches' keys on the device (module docstring): its ``backend``
    can (``DeviceBackend.dedups_on_device``), it runs on one rank (no exchange of keys) and none of its
    ``features`` reads a batch's keys on the host (``Feature.needs_host_keys``)."""
    return (getattr(backend, "dedups_on_device", False) and ranks == 1
            and not any(f.needs_host_keys for f in features))


class BatchPlanner:
    """The prepare and place stages' planning of a batch (module docstring). ``sync``: the sparse sync
    (host plans); ``backend``: the train step's backend; ``on_device``: :func:`dedups_on_device`."""

    def __init__(self, sync, backend, on_device: bool):
        self.sync, self.backend, self.on_device = sync, backend, bool(on_device)
        # the host path on a device: the working set goes up once (WorkingSet)
        self.keeps_working_set = not self.on_device and hasattr(backend, "upload_working_set")

    def plan(self, w):
        """Prepare stage: the keys batch ``w`` needs resident on this rank (host uint64, or
        :class:`DeviceKeys`); sets ``w.plans`` (host path) or ``w.uploaded`` (device path). Collective
        over the prepare channel on the host path (``sync.plan``)."""
        if not self.on_device:
            resident, w.plans = self.sync.plan(w.local, w.hot)
            if self.keeps_working_set:
                w.uploaded = self.backend.upload_working_set(resident)
            return resident
        w.uploaded = self.backend.upload(w.local.data)
        return w.uploaded.working_set

    def stage(self, w, table) -> list:
        """Place stage: the step's inputs of every mini-batch of ``w`` (``Backend.stage``); on the device
        path also ``w.plans``, whose keys and inverse are the device arrays the step reads."""
        if self.keeps_working_set:  # w.uploaded stays with w until trained: the place stream reads it
            return self.backend.stage(w.local, w.plans, table, working_set=w.uploaded)
        if not self.on_device:
            return self.backend.stage(w.local, w.plans, table)
        staged, w.uploaded = self.backend.stage_uploaded(w.uploaded, w.local.bounds, table), None
        flat = self.backend.placed.flat  # a mini-batch's keys, also where they were partitioned for parts
        w.plans = [Plan(keys, d.inv, ukeys=keys) for d in staged for keys in (flat(d.keys),)]
        return staged
