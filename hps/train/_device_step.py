"""GPU-resident training for ``--device cuda`` (issue 12): rows stay in the HBM-PS, updates go
through kernels on the table's own rows.

Per batch, in the place stage (:meth:`DeviceStep.upload`): the plan of every local mini-batch — the
keys whose rows this rank updates, the inverse index and field of every key occurrence, weights,
offsets, labels, dense features, and in owner mode the index of every key other ranks asked — goes
up once through the :class:`~hps.gpu.TransferLedger` (purpose ``plan``), on the place stage's own
CUDA stream (blocking w.r.t. the legacy default stream, so an upload into memory the pool recycles
waits for the kernels that last used it), which the place stage synchronises before handing the
batch on.

Per mini-batch, in the train stage (:meth:`DeviceStep.train_batch`), everything on the default
stream, so ordered before the table's own next call (insert, erase, purge, growth)::

    find_slots(keys) -> pool_forward (from the table rows) -> model.forward_backward_pooled
    (dense model on the array module; bce_loss_grad adds the loss to a device accumulator)
    -> pool_backward (per-key sums in a fixed order, no atomics) -> [MPI] -> row optimizer kernel on the
    table rows in place -> [MPI] dense all-reduce -> dense step

Once per batch the loss and the missing-key count come back (16 bytes, ``minibatch``). Nothing else
crosses inside the mini-batch loop on one process. With several ranks what MPI needs is staged
through the host and counted as ``mpi``: in owner mode the asked rows' parameters (owner -> asker)
and the per-key gradients (asker -> owner, summed there in rank order); with ``--sparse-sync
allreduce`` the per-key gradients and the reduced keys; the dense gradient either way. The
device->host copy before an MPI call is what synchronises the stream. ``cuda_aware`` is detected
(``hps.comm.cuda_aware``) and reported, but device buffers are staged even then (passing them to MPI
directly is not implemented).

Rows enter and leave the HBM-PS only between batches, through :class:`LedgerTable` (``fetch`` in,
``writeback`` out: evictions, checkpoints, evaluation lookups).

With ``--n-parts`` > 1 the HBM-PS is a ``PartitionedHashTable`` over the node's GPUs: the place stage
also partitions each mini-batch's keys on the device, and the train step reaches the rows part by
part (``_device_rows.Parts``: slots, gathers and updates on each part's GPU, peer copies to and from
the main GPU). The step above is written once over ``self.rows`` (``OneTable`` or ``Parts``).

Under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``) the array module is NumPy (``hps._xp``), the
kernels run in the simulator, and the ledger counts the copies a GPU would make.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from ..comm import SPARSE_GRADS, SPARSE_ROWS
from ..comm._kernels import segment_sum
from ..errors import InternalError
from ..gpu import (
    PURPOSES,
    BatchScalars,
    Placement,
    TransferLedger,
    backward_plan,
    bce_loss_grad_async,
    pool_backward_sorted_async,
    pool_forward_rows_async,
)
from ._device_rows import OneTable, Parts

__all__ = ["DeviceStep", "LedgerTable", "make_device_step", "transfer_metrics"]


class LedgerTable:
    """The HBM-PS as :class:`~hps.train._hierarchy.ParameterHierarchy` uses it on ``--device cuda``: the
    table's batch calls on host arrays, every copy counted by the ledger — keys and rows going in as
    ``fetch``, keys of evictions and lookups and the rows coming out as ``writeback``. The train stage
    reaches the rows through :meth:`device_view` only. Thread safety: the table's (its lock).

    A :class:`~hps.gpu.PartitionedHashTable` gets the host arrays themselves: they are split on the
    host, where they are, and each part uploads its own share to its GPU (the ledger records those
    copies); ``device_view`` then yields the list of the parts' views."""

    def __init__(self, table, ledger: TransferLedger):
        self.table = table
        self.ledger = ledger
        self.parted = hasattr(table, "device_views")

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """keys (n,) uint64, rows (n, row_width) host arrays. Blocking."""
        if self.parted:
            self.ledger.record("h2d", "fetch", keys.nbytes + rows.nbytes)
            self.table.insert(keys, rows)
        else:
            self.table.insert(self.ledger.to_device(keys, "fetch"), self.ledger.to_device(rows, "fetch"))

    def get(self, keys: np.ndarray):
        """(rows (n, row_width), found (n,) bool) host arrays of host ``keys``. Blocking."""
        if self.parted:
            rows, found = self.table.get(keys)
            self.ledger.record("h2d", "writeback", keys.nbytes)
            self.ledger.record("d2h", "writeback", rows.nbytes + found.nbytes)
            return rows, found
        rows, found = self.table.get(self.ledger.to_device(keys, "writeback"))
        return self.ledger.to_host(rows, "writeback"), self.ledger.to_host(found, "writeback")

    def erase(self, keys: np.ndarray) -> int:
        if self.parted:
            self.ledger.record("h2d", "writeback", keys.nbytes)
            return self.table.erase(keys)
        return self.table.erase(self.ledger.to_device(keys, "writeback"))

    def reserve(self, capacity: int) -> None:
        self.table.reserve(capacity)

    def device_view(self):
        """The table's view (one part) or the list of its parts' views, its lock(s) held."""
        return self.table.device_views() if self.parted else self.table.device_view()

    @property
    def capacity(self) -> int:
        return self.table.capacity

    def __len__(self) -> int:
        return len(self.table)


@dataclass
class DevicePlan:
    """One local mini-batch's plan on the device (from :meth:`DeviceStep.upload`). ``keys`` (u,) uint64:
    the keys whose rows this rank reads and updates (the mini-batch's unique keys; in owner mode with
    several ranks the owned keys anyone asked, ``Plan.ukeys``); ``uinv`` (m,) int64 (owner mode,
    several ranks): the index into ``keys`` of every key asked, grouped by asking rank; the rest as
    ``hps.data.Batch`` (``inv`` (nnz,) int64, ``field`` (nnz,) int32, ``weights`` (nnz,) float,
    ``offsets`` (n + 1,) int64, ``labels`` (n,) float, ``dense`` (n, n_dense) float or None)."""

    keys: object      # (u,) uint64, or with several parts their ``_device_rows.PartKeys``
    inv: object
    field: object
    weights: object
    offsets: object
    labels: object
    dense: object
    uinv: object = None
    bwd: object = None  # hps.gpu.BackwardPlan: the gradient sums in a fixed order (runs repeat bit for bit)


class DeviceStep:
    """The train step of ``--device cuda`` (see the module docstring). ``coll``: the job's
    :class:`Collectives`; ``replicated``: ``--sparse-sync allreduce``. Construction is collective over
    the main channel when there are several ranks (CUDA-aware MPI detection).

    Thread safety: :meth:`upload` is called by the place thread, :meth:`train_batch` by the train
    thread; the ledger is shared and thread-safe. Every kernel of the train step is launched while
    holding the table's lock (``device_view``), which also serialises it with the table's own kernels
    of other threads: Numba's CUDA simulator cannot run two threads' kernels at once."""

    def __init__(self, coll, model, sparse_opt, dense_opt, row_params: int, xp, replicated: bool,
                 placement=None):
        self.coll, self.model, self.sparse_opt, self.dense_opt = coll, model, sparse_opt, dense_opt
        self.row_params, self.xp, self.replicated = int(row_params), xp, bool(replicated)
        self.ledger = TransferLedger(xp)
        self.scalars = BatchScalars()
        # where the rows are: one table on the main GPU, or parts over the node's GPUs (_device_rows)
        self.rows = (OneTable(xp, row_params) if placement is None
                     else Parts(xp, row_params, placement, self.ledger))
        self.cuda_aware = False
        if coll.size > 1:
            from ..comm import cuda_aware

            self.cuda_aware = cuda_aware(coll.main.comm)
        self._plan_stream = xp.cuda.Stream() if xp.__name__ == "cupy" else None

    def wrap(self, table) -> LedgerTable:
        """The HBM-PS ``table`` with its host copies counted (for ``ParameterHierarchy``)."""
        return LedgerTable(table, self.ledger)

    @property
    def _owner_exchange(self) -> bool:
        return not self.replicated and self.coll.size > 1

    # -- place stage --------------------------------------------------------------------------------------
    def upload(self, local, plans, table) -> list[DevicePlan]:
        """Upload the plans of a batch (``local``: its LocalBatch, ``plans``: its ``_sync.Plan`` list),
        counted as ``plan``; with several HBM-PS parts, partition each mini-batch's keys on the device
        (under ``table``'s locks: the simulator runs one thread's kernels at a time). Blocks the
        calling (place) thread until the copies are done."""
        dt = self.model.dtype
        s = self._plan_stream

        def up(a, dtype):
            return self.ledger.to_device(np.ascontiguousarray(a, dtype=dtype), "plan", stream=s)

        out = []
        for j, p in enumerate(plans):
            b = local.minibatch(j)
            owner = self._owner_exchange
            out.append(DevicePlan(
                keys=up(p.ukeys if owner else p.keys, np.uint64), inv=up(p.inv, np.int64),
                field=up(b.field, np.int32), weights=up(b.weights, dt), offsets=up(b.offsets, np.int64),
                labels=up(b.labels, dt), dense=up(b.dense, dt) if self.model.n_dense else None,
                uinv=up(p.uinv, np.int64) if owner else None))
            with s if s is not None else contextlib.nullcontext():
                d = out[-1]
                d.bwd = backward_plan(d.inv, d.field, d.weights, d.offsets, p.keys.shape[0], self.row_params, self.xp)
        if s is not None:
            s.synchronize()
        if isinstance(self.rows, Parts):
            with table.device_view():
                for d in out:
                    d.keys = self.rows.split(d.keys, "plan")
        return out

    # -- train stage --------------------------------------------------------------------------------------
    def train_batch(self, table, plans, staged, n_total, index: int = 0, schedule=None) -> float:
        """Train one batch: ``plans`` its ``_sync.Plan`` list, ``staged`` its :meth:`upload`,
        ``n_total`` (P,) examples of each global mini-batch; ``schedule(index, j)``, when given, sets
        the learning rates of mini-batch j of batch ``index`` (``_schedule.Schedule.apply``). Returns this rank's sum of per-example
        losses (read once, at the end). Collective over the train channel per mini-batch."""
        with table.device_view():  # every launch under the table's lock (see the class docstring)
            self.scalars.zero()
        for j, (p, d) in enumerate(zip(plans, staged)):
            n = int(n_total[j])
            if n == 0:
                continue  # every shard had run out
            if schedule is not None:
                schedule(index, j)
            with table.device_view() as view:
                grads = self._minibatch(view, p, d, n)
            self._dense_step(grads)
            self.ledger.minibatch()
        with table.device_view():
            self.rows.finish(self.scalars)
        got = self.scalars.read(self.ledger)
        if got["missing"]:
            raise InternalError(f"{got['missing']} working-set keys were missing from HBM-PS in this batch "
                                "(residency bug)")
        return got["loss"]

    def _minibatch(self, view, p, d: DevicePlan, n_total: int) -> dict:
        """One mini-batch on the device; returns the dense gradients (xp). ``view``: the table's view,
        or its parts' views (``self.rows`` knows which)."""
        xp, P, m, R = self.xp, self.row_params, self.model, self.rows
        ch = self.coll.train
        n = d.offsets.shape[0] - 1
        keys = d.keys
        slots = R.find(view, keys, self.scalars)
        pooled = xp.empty((n, m.n_fields * P), m.dtype)
        u = p.keys.shape[0]  # this rank's unique keys
        if self._owner_exchange:  # rows of the asked keys go to the asking ranks
            sent = xp.empty((d.uinv.shape[0], P), m.dtype)
            R.gather(view, slots, keys, d.uinv, sent)
            got = ch.alltoallv(self.ledger.to_host(sent, "mpi"), p.recv, p.send, SPARSE_ROWS)
            params = self.ledger.to_device(got, "mpi")
            pool_forward_rows_async(params, xp.arange(u, dtype=np.int64), d.inv, d.field, d.weights,
                                    d.offsets, pooled)
        else:
            R.pool(view, slots, keys, d, pooled)
        d_pooled, g_dense = m.forward_backward_pooled(pooled, d.dense,
                                                      lambda z: self._loss_grad(z, d.labels, n_total))
        grads = xp.empty((u, P), m.dtype)
        pool_backward_sorted_async(d_pooled, d.bwd, grads)
        if self._owner_exchange:  # per-key sums go to the owners, summed there in rank order
            back = ch.alltoallv(self.ledger.to_host(grads, "mpi"), p.send, p.recv, SPARSE_GRADS)
            grads = self.ledger.to_device(segment_sum(back, p.uinv, p.ukeys.shape[0]), "mpi")
        elif self.coll.size > 1:  # allreduce: every replica applies every update
            reduced, g = ch.sparse_allreduce(p.keys, self.ledger.to_host(grads, "mpi"))
            grads = self.ledger.to_device(g, "mpi")
            keys = R.split(self.ledger.to_device(reduced, "mpi"), "mpi")
            slots = R.find(view, keys, self.scalars)
        R.update(view, slots, keys, grads, self.sparse_opt)
        return g_dense

    def _loss_grad(self, z, labels, n_total: int):
        dz = self.xp.empty_like(z)
        bce_loss_grad_async(z, labels, n_total, dz, self.scalars.loss)
        return dz

    def _dense_step(self, grads: dict) -> None:
        """Sum the dense gradients over ranks (staged through the host as ``mpi``) and step."""
        if self.coll.size > 1:
            names = list(grads)
            flat = self.xp.concatenate([grads[k].ravel() for k in names])
            flat = self.ledger.to_device(self.coll.train.dense_allreduce(self.ledger.to_host(flat, "mpi")), "mpi")
            off = 0
            for k in names:
                size = grads[k].size
                grads[k] = flat[off:off + size].reshape(grads[k].shape)
                off += size
        self.dense_opt.step(self.model.params, grads)


def make_device_step(cfg, coll, model, sparse_opt, dense_opt, row_params: int, xp, replicated: bool):
    """The :class:`DeviceStep` of a ``--device cuda`` job, else None (the CPU backend). With
    ``--n-parts`` > 1 the HBM-PS parts spread over ``--gpus`` GPUs (:class:`~hps.gpu.Placement`;
    ``make_hbm`` must be given the same ``gpus``)."""
    t = cfg.tiers
    if t.device != "cuda":
        return None
    placement = Placement(t.n_parts, t.gpus) if t.n_parts > 1 else None
    return DeviceStep(coll, model, sparse_opt, dense_opt, row_params, xp, replicated, placement)


def transfer_metrics(per_rank: list) -> dict:
    """``h2d_bytes`` / ``d2h_bytes`` (purpose -> bytes, summed over ranks), ``peer_bytes`` (between
    the GPUs of a rank, summed) and ``minibatches`` (rank 0's count: every rank runs every global
    mini-batch) from the ledgers' ``metrics()`` of every rank (None for a rank without a device step:
    zeros)."""
    zero = TransferLedger().metrics()
    per = [m or zero for m in per_rank]
    return {"h2d_bytes": {k: sum(m["h2d_bytes"][k] for m in per) for k in PURPOSES},
            "d2h_bytes": {k: sum(m["d2h_bytes"][k] for m in per) for k in PURPOSES},
            "peer_bytes": sum(m["peer_bytes"] for m in per),
            "minibatches": per[0]["minibatches"]}
