"""The ``--device cuda`` implementation of the train step's :class:`~hps.train._backend.Backend`: rows stay
in the HBM-PS, pooling, gradient reduction and the row optimizers run as CUDA kernels on the table's
own rows (``hps.gpu``), the dense model on CuPy.

Per batch, where its keys are deduplicated on the device (``_device_batch``): in the prepare stage
its raw arrays go up once through a pinned staging buffer and its distinct keys are computed there
(:meth:`DeviceBackend.upload`); in the place stage every mini-batch's plan is made from them on the
device (:meth:`DeviceBackend.stage_uploaded`). Otherwise, in the place stage (:meth:`DeviceBackend.stage`):
the plan of every local mini-batch — the keys whose rows this rank reads and updates, the inverse index
and field of every key occurrence, weights, offsets, labels, dense features, and in owner mode the index
of every key other ranks asked — goes up once through the :class:`~hps.gpu.TransferLedger` (purpose
``plan``; indices in the smallest dtype that holds them, widened on the device).

Streams (``hps.gpu.PlanStreams``, whose docstring has every ordering): prepare's upload and dedup run
on the ``upload`` stream, the place stage's plans on the ``place`` stream, both non-blocking w.r.t. the
legacy default stream where the train stage's kernels and the table's operations run, so on the
device a batch goes up and is planned while the batches before it train. Prepare waits on the host
for its own upload (an event; the residency lookup follows on the legacy stream), place makes its
stream wait for that event, and the train stage makes its stream wait for the event the place stage
recorded (:meth:`DeviceBackend.begin_batch`): no host block between place and train. Memory: CuPy's
pool recycles a freed block on the stream that allocated it without waiting for other streams; the
train thread drops a batch's arrays only after :meth:`DeviceBackend.end_batch` read its scalars (a
blocking copy behind all its kernels), so no recycled block is still read by a train kernel.

The order of each mini-batch's gradient sums is planned in the place stage too (``hps.gpu.backward_plan``),
so no float sum depends on the order threads run in and a job repeats bit for bit. With ``--n-parts``
> 1 each mini-batch's keys are also partitioned on the device there.

Per mini-batch, in the train stage, everything on the default stream, so ordered before the table's
own next call (insert, erase, purge, growth)::

    find_slots(keys) -> pool_forward (from the table rows, or from rows received over MPI)
    -> model.forward_backward_pooled (bce_loss_grad adds the loss to a device accumulator)
    -> pool_backward (per-key sums in a fixed order, no atomics) -> row optimizer kernel on the rows in place

Once per batch the loss and the missing-key count come back (16 bytes, ``minibatch``); FAE's strip
loss reads the loss once per mini-batch the same way. Everything MPI carries is staged through the
host and counted as ``mpi`` (:meth:`DeviceBackend.to_host` / :meth:`~DeviceBackend.to_device`); the
device->host copy before an MPI call is what synchronises the stream. ``cuda_aware`` is detected
(``hps.comm.cuda_aware``) and reported, but device buffers are staged even then (passing them to MPI
directly is not implemented).

Rows enter and leave the HBM-PS in the prepare stage, through :class:`LedgerTable`: the residency
lookup of each batch's working set (``plan``: its keys up unless they are on the device already, the
misses down), the misses' keys and rows in (``fetch``), the rows that leave it (``writeback``: the
budget's victims in one batched call, checkpoints and exports, evaluation lookups, HET's owner updates).

Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the array module is NumPy (``hps._xp``), the
kernels run in the simulator, and the ledger counts the copies a GPU would make.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InternalError
from ..gpu import (
    BatchScalars,
    Placement,
    PinnedStaging,
    PlanStreams,
    index_dtype,
    TransferLedger,
    backward_plan,
    bce_loss_grad_async,
    minibatch_plans,
    pool_backward_sorted_async,
    pool_forward_rows_async,
    stream_api,
    unique_keys,
)
from ._device_batch import DeviceBatch, DeviceKeys, WorkingSet, raw_nbytes
from ._device_rows import OneTable, Parts
from ._device_table import LedgerTable

__all__ = ["DeviceBackend", "LedgerTable", "StagedBatch"]  # LedgerTable: ``_device_table``


@dataclass
class DevicePlan:
    """One local mini-batch's inputs on the device (from :meth:`DeviceBackend.stage`). ``keys`` (u,)
    uint64: the keys whose rows this rank reads and updates (the mini-batch's unique keys; in owner
    mode with several ranks the owned keys anyone asked, ``Plan.ukeys``); ``uinv`` (m,) int64 (owner
    mode, several ranks): the index into ``keys`` of every key asked, grouped by asking rank; the rest
    as ``hps.data.Batch`` (``inv`` (nnz,) int64, ``field`` (nnz,) int32, ``weights`` (nnz,) float,
    ``offsets`` (n + 1,) int64, ``labels`` (n,) float, ``dense`` (n, n_dense) float or None); ``hot``
    (k,) int64 the mini-batch's FAE hot slots (``Plan.hot_slots``; None when it has none); ``bwd`` the
    order of its gradient sums (``hps.gpu.BackwardPlan`` over the rows ``inv`` indexes: the mini-batch's
    keys, then its hot rows). The event that says they are made is their batch's
    (:class:`StagedBatch`)."""

    keys: object      # (u,) uint64, or with several parts their ``_device_rows.PartKeys``
    inv: object
    field: object
    weights: object
    offsets: object
    labels: object
    dense: object
    uinv: object = None
    hot: object = None
    bwd: object = None


class StagedBatch(list):
    """What the place stage made of a batch (:meth:`DeviceBackend.stage`, :meth:`~DeviceBackend.stage_uploaded`):
    the :class:`DevicePlan` of every local mini-batch, in order (the list), and ``ready``, the one event
    the place stage recorded after all of them (``hps.gpu.PlanStreams``; None without streams), which
    :meth:`DeviceBackend.begin_batch` makes the train stage wait for."""

    def __init__(self, plans, ready=None):
        super().__init__(plans)
        self.ready = ready


def _n(a) -> int:
    return 0 if a is None else int(a.shape[0])


@dataclass
class Slots:
    """Rows found on the device: ``keys`` (staged) and their ``slots`` (per part with several)."""

    keys: object
    slots: object


class _DeviceRows:
    """:class:`~hps.train._backend.RowAccess` over the HBM-PS table's view (or its parts' views)."""

    def __init__(self, backend: "DeviceBackend", view):
        self.be, self.view = backend, view

    def stage_keys(self, keys):
        return self.be.placed.split(self.be.to_device(np.ascontiguousarray(keys, np.uint64)), "mpi")

    def find(self, keys) -> Slots:
        return Slots(keys, self.be.placed.find(self.view, keys, self.be.scalars))

    def gather(self, found: Slots, idx, cols: int):
        xp = self.be.xp
        if idx is None:
            idx = xp.arange(found.keys.shape[0], dtype=np.int64)
        out = xp.empty((idx.shape[0], cols), self.be.model.dtype)
        self.be.placed.gather(self.view, found.slots, found.keys, idx, out)
        return out

    def update(self, found: Slots, grads, opt) -> None:
        self.be.placed.update(self.view, found.slots, found.keys, grads, opt)


class _Rows:
    """The context of :meth:`DeviceBackend.rows`: the table's view held (its lock: no purge or growth,
    and the simulator runs one thread's kernels at a time) for the block."""

    def __init__(self, backend, table):
        self.be, self.table, self._cm = backend, table, None

    def __enter__(self):
        self._cm = self.table.device_view()
        return _DeviceRows(self.be, self._cm.__enter__())

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


class DeviceBackend:
    """:class:`~hps.train._backend.Backend` of ``--device cuda``. ``model``: the FieldModel over ``xp``;
    ``coll``: the job's Collectives (construction is collective over its main channel with several
    ranks: CUDA-aware MPI detection); ``placement``: the HBM-PS parts' GPUs (None: one table).

    Thread safety: :meth:`stage` runs in the place thread, the rest in the train thread; the ledger is
    shared and thread-safe. Every kernel runs under the table's lock (:meth:`rows`)."""

    #: The GIL switch interval of training (Python's is 0.005 s): the train stage's every CuPy operation
    #: and cuBLAS call (and kernel launch, but for ``hps._driver_launch``'s default ``driver-gil``) hands
    #: the GIL back and must wait to get it again while the prepare and place stages run Python. The issue's job on an H200 (``python -m bench.bench_device --no-cpu``, 2026-11-27,
    #: bench/results/gpu-h200-2026-11-27-night/): 499,758 examples/s at 0.005, 557,554 at 0.0002,
    #: 563,225 at 0.001 (one run each).
    switch_interval = 0.001

    def __init__(self, model, xp, coll, placement: Placement | None = None):
        self.model, self.xp = model, xp
        self.P = int(model.row_params)
        self.ledger = TransferLedger(xp)
        self.scalars = BatchScalars()
        # where the rows are: one table on the main GPU, or parts over the node's GPUs (_device_rows)
        self.placed = OneTable(xp, self.P) if placement is None else Parts(xp, self.P, placement, self.ledger)
        self.cuda_aware = False
        if coll.size > 1:
            from ..comm import cuda_aware

            self.cuda_aware = cuda_aware(coll.main.comm)
        self.streams = PlanStreams(stream_api(xp))  # upload (prepare thread), place (place thread)
        self.staging = PinnedStaging(xp, self.ledger)  # the prepare stage's uploads (one thread)
        self._read = 0.0       # the loss accumulator when last read (minibatch_loss)
        self._n_total = 1

    def wrap(self, table) -> LedgerTable:
        self.hbm = LedgerTable(table, self.ledger, self.placed)
        return self.hbm

    # -- prepare and place stages ----------------------------------------------------------------------
    #: A batch's keys can be deduplicated on the device (:meth:`upload`, :meth:`stage_uploaded`), with
    #: one HBM-PS table or parts; where they are not (``_device_batch.dedups_on_device``), the working
    #: set goes up once (:meth:`upload_working_set`, which ``BatchPlanner`` looks for) and each
    #: mini-batch's keys as positions in it.
    dedups_on_device = True

    def upload(self, batch) -> DeviceBatch:
        """Prepare stage: the raw arrays of ``batch`` (a local ``hps.data.Batch``) up once, packed in one
        copy through the pinned staging buffer (``plan``), on the ``upload`` stream, and the batch's
        distinct keys computed there (``hps.gpu.unique_keys``: first-occurrence order, the host's working
        set); then an event recorded on that stream (``DeviceBatch.uploaded``). Blocks the calling
        (prepare) thread until that event: the residency lookup that follows runs on the legacy stream,
        and the upload stream does not wait for the train stage's kernels (``hps.gpu.PlanStreams``)."""
        dt, st = self.model.dtype, self.streams
        host = [np.ascontiguousarray(batch.keys, np.uint64), np.ascontiguousarray(batch.field, np.int32),
                np.ascontiguousarray(batch.weights, dt), np.ascontiguousarray(batch.offsets, np.int64),
                np.ascontiguousarray(batch.labels, dt)]
        if self.model.n_dense:
            host.append(np.ascontiguousarray(batch.dense, dt))

        def work():
            dev = self.staging.upload(host, "plan", stream=st.upload)
            return dev, unique_keys(dev[0], self.xp)

        (dev, working_set), uploaded = st.uploaded(work)
        self.ledger.batch(raw_nbytes(batch), on_device=True)
        return DeviceBatch(*dev[:5], dev[5] if self.model.n_dense else None, host[3], DeviceKeys(working_set),
                           uploaded)

    def stage_uploaded(self, raw: DeviceBatch, bounds, table) -> StagedBatch:
        """Place stage, keys deduplicated on the device: the :class:`DevicePlan` of every local
        mini-batch (examples ``bounds[j]:bounds[j + 1]``, (P + 1,) host) built on the device from slices
        of ``raw`` (:meth:`upload`): its distinct keys and inverse (the host plan's order), its offsets
        rebased, the order of its gradient sums, all mini-batches in one pass over the batch
        (``hps.gpu.minibatch_plans``); the P + 1 bounds go up and 2 (P + 1) offsets come down (``plan``). On
        the ``place`` stream, after it waited (on the device) for ``raw.uploaded``; the batch's ``ready``
        is the event recorded after them, which :meth:`begin_batch` waits for. Asynchronous but for
        those two reads of sizes, which wait for the place stream only, and with several HBM-PS parts the partition of every mini-batch's keys (:meth:`_split`,
        under the locks of ``table``, the wrapped HBM-PS; unused with one table)."""
        st, out = self.streams, []
        with st.on(st.place):
            st.wait(raw.uploaded, st.place)
            plans = minibatch_plans(raw.keys, raw.field, raw.weights, raw.offsets, bounds, raw.host_offsets, self.P,
                                    self.xp, read=lambda a: self.ledger.to_host(a, "plan", stream=st.place),
                                    upload=lambda h: self.ledger.to_device(h, "plan", stream=st.place))
            for j, (keys, inv, offsets, bwd) in enumerate(plans):
                a, b = int(bounds[j]), int(bounds[j + 1])
                ka, kb = int(raw.host_offsets[a]), int(raw.host_offsets[b])
                out.append(DevicePlan(keys=keys, inv=inv, field=raw.field[ka:kb], weights=raw.weights[ka:kb],
                                      offsets=offsets, labels=raw.labels[a:b],
                                      dense=None if raw.dense is None else raw.dense[a:b], bwd=bwd))
        return self._split(StagedBatch(out, st.record(st.place)), table)

    def upload_working_set(self, keys: np.ndarray) -> WorkingSet:
        """Prepare stage, host path: the batch's working set ``keys`` (u,) uint64
        (host, unique) up once (``plan``) on the ``upload`` stream, waited for on the host (the
        residency lookup follows on the legacy stream), and kept for the lookup of this very array
        (``LedgerTable.keep``: it uploads nothing); :meth:`stage` gathers the mini-batches' keys from it."""
        st = self.streams
        dev, uploaded = st.uploaded(lambda: self.ledger.to_device(np.ascontiguousarray(keys, np.uint64), "plan",
                                                                  stream=st.upload))
        self.hbm.keep(keys, dev)
        return WorkingSet(keys, dev, uploaded)

    def stage(self, local, plans, table, working_set: WorkingSet | None = None) -> StagedBatch:
        """Upload the plans of a batch on the ``place`` stream, counted as ``plan``: indices and fields
        in the smallest unsigned dtype that holds them (``hps.gpu.index_dtype``), widened on the device;
        the batch's ``ready`` is the event recorded after them (:meth:`begin_batch` waits for it). With
        ``working_set`` (:meth:`upload_working_set`) each mini-batch's keys go up as their positions in
        it and are gathered from its device copy (after its event), unless one is not there.
        With several HBM-PS parts, each mini-batch's keys are then partitioned on the device
        (:meth:`_split`)."""
        dt, st, n_fields = self.model.dtype, self.streams, int(local.data.n_fields)

        def up(a, dtype):
            return self.ledger.to_device(np.ascontiguousarray(a, dtype=dtype), "plan", stream=st.place)

        def index(a, bound: int, wide=np.int64):  # every value of ``a`` is in [0, bound]
            return up(a, index_dtype(bound)).astype(wide, copy=False)

        def keys_up(keys):
            at = None if working_set is None else working_set.index(keys)
            if at is None:
                return up(keys, np.uint64)
            return working_set.dev[index(at, max(working_set.host.shape[0] - 1, 0))]

        out = []
        with st.on(st.place):
            if working_set is not None:
                st.wait(working_set.uploaded, st.place)
            for j, p in enumerate(plans):
                b, owner = local.minibatch(j), p.uinv is not None
                keys = p.ukeys if owner else p.keys
                nnz, u = int(b.keys.shape[0]), p.keys.shape[0] + _n(p.hot_slots)   # rows inv indexes
                out.append(DevicePlan(
                    keys=keys_up(keys), inv=index(p.inv, u),
                    field=index(b.field, n_fields, np.int32), weights=up(b.weights, dt),
                    offsets=index(b.offsets, nnz), labels=up(b.labels, dt),
                    dense=up(b.dense, dt) if self.model.n_dense else None,
                    uinv=index(p.uinv, keys.shape[0]) if owner else None,
                    hot=up(p.hot_slots, np.int64) if _n(p.hot_slots) else None))
                self._backward_plan(out[-1], u)
        self.ledger.batch(raw_nbytes(local.data), on_device=False)
        return self._split(StagedBatch(out, st.record(st.place)), table)

    def _split(self, staged: StagedBatch, table) -> StagedBatch:
        """``staged`` with, for several HBM-PS parts, every mini-batch's keys partitioned on the device
        (``_device_rows.Parts.split``, its counts ``plan``) under ``table``'s locks (the simulator runs one
        thread's kernels at a time), on the current stream after a host wait for ``staged.ready`` (the
        partition reads its counts on the host anyway)."""
        if isinstance(self.placed, Parts):
            self.streams.host_wait(staged.ready)
            with table.device_view():
                for d in staged:
                    d.keys = self.placed.split(d.keys, "plan")
        return staged

    def _backward_plan(self, d: DevicePlan, u: int) -> None:
        """The order of ``d``'s gradient sums over the ``u`` rows its ``inv`` indexes (keys, then hot
        rows). On the current stream."""
        d.bwd = backward_plan(d.inv, d.field, d.weights, d.offsets, u, self.P, self.xp)

    # -- train stage --------------------------------------------------------------------------------------
    def rows(self, table) -> _Rows:
        return _Rows(self, table)

    def forward_backward(self, params, d: DevicePlan, n_total: int):
        def pool(out):
            ident = self.xp.arange(params.shape[0], dtype=np.int64)
            pool_forward_rows_async(params, ident, d.inv, d.field, d.weights, d.offsets, out)

        return self._forward_backward(pool, params.shape[0], d, n_total)

    def forward_backward_resident(self, R: _DeviceRows, found: Slots, d: DevicePlan, n_total: int):
        return self._forward_backward(lambda out: self.placed.pool(R.view, found.slots, found.keys, d, out),
                                      found.keys.shape[0], d, n_total)

    def _forward_backward(self, pool, u: int, d: DevicePlan, n_total: int):
        xp, m = self.xp, self.model
        pooled = xp.empty((d.offsets.shape[0] - 1, m.n_fields * self.P), m.dtype)
        pool(pooled)
        d_pooled, g_dense = m.forward_backward_pooled(pooled, d.dense, lambda z: self._loss_grad(z, d.labels, n_total))
        grads = xp.empty((u, self.P), m.dtype)
        pool_backward_sorted_async(d_pooled, d.bwd, grads)
        self._n_total = n_total
        return grads, g_dense

    def _loss_grad(self, z, labels, n_total: int):
        dz = self.xp.empty_like(z)
        bce_loss_grad_async(z, labels, n_total, dz, self.scalars.loss)
        return dz

    def to_host(self, a, purpose: str = "mpi"):
        return self.ledger.to_host(a, purpose)

    def to_device(self, a, purpose: str = "mpi"):
        return self.ledger.to_device(a, purpose)

    def begin_batch(self, table, staged: StagedBatch | None = None) -> None:
        """Train stage, before a batch's first step: its current (the legacy) stream waits on the device
        for the place stage's event of ``staged`` (``StagedBatch.ready``), so its kernels read the plans
        only once made; the batch's scalars zeroed. Does not block the host."""
        if staged is not None:
            self.streams.wait(staged.ready)
        with table.device_view():  # every launch under the table's lock (see the class docstring)
            self.scalars.zero()
        self._read = 0.0

    def end_minibatch(self) -> None:
        self.ledger.minibatch()

    def minibatch_loss(self) -> float:
        """One 16-byte read (``minibatch``) of the loss accumulator: the last mini-batch's term."""
        total = self.scalars.read(self.ledger)["loss"]
        term, self._read = (total - self._read) / self._n_total, total
        return term

    def end_batch(self, table) -> float:
        with table.device_view():
            self.placed.finish(self.scalars)
        got = self.scalars.read(self.ledger)
        if got["missing"]:
            raise InternalError(f"{got['missing']} working-set keys were missing from HBM-PS in this batch "
                                "(residency bug)")
        return got["loss"]

    def transfers(self) -> dict:
        """The ledger's metrics, and ``gpu_paths``: how the host drove the GPU (the modes in effect at the
        end: a probe that failed shows as the fallback) and what the network's CUDA graphs did."""
        from .. import _cublas, _driver_launch, _launch
        from ..model._dense_optim import device_step
        from ..model._layers import LAYER_STEP

        host = self.xp is np   # the CUDA simulator: NumPy arrays, kernels run as Python
        paths = {"launch": "simulator" if _launch.simulated() else _driver_launch.mode(),
                 "gemm": "numpy" if host else _cublas.mode(), "layers": "numpy" if host else LAYER_STEP.get(),
                 "dense_step": device_step(), "graphs": self.model.cuda_graphs()}
        return {**self.ledger.metrics(), "gpu_paths": paths}
