"""The device-specific part of the train step, behind one small interface (:class:`Backend`).

The train step — the sparse sync strategies (``_sync``: owner, allreduce; ``_het_sync``: HET) and the
dense sync strategies (``_dense_sync``: allreduce with or without compression; ``_easgd``) — is written
once over the array module ``xp`` (NumPy or CuPy; NumPy under the CUDA simulator, ``hps._xp``). What
differs between the devices is behind :class:`Backend`:

- **the resident rows** (:meth:`Backend.rows` -> :class:`RowAccess`): find the rows of a mini-batch's
  keys in the HBM-PS (or its CPU twin), gather their columns, apply the row optimizer to them in place;
  where the rows are found — a copy taken with the table's ``get`` on the CPU, slots of the HBM-PS table
  (or of its parts) on the GPU — stays behind the interface (:class:`Found` is opaque to the step);
- **pooling, forward/backward and the loss** (:meth:`Backend.forward_backward`,
  :meth:`Backend.forward_backward_resident`): the CPU hands parameter rows to the model's
  ``forward_backward`` (Numba pooling kernels, the loss on the host); the GPU pools straight from the
  table's rows, runs ``forward_backward_pooled`` and keeps the loss in a device accumulator;
- **staging of what MPI carries** (:meth:`Backend.to_host`, :meth:`Backend.to_device`): nothing on the
  CPU; host copies counted by the ``TransferLedger`` as ``mpi`` on the GPU;
- **the batch's inputs** (:meth:`Backend.stage`, place stage): host slices of the batch on the CPU, one
  upload of the plans on the GPU.

This module holds the interface and the CPU implementation (:class:`HostBackend`), which calls exactly
the CPU kernels the host step always called, in the same order, so CPU results are bit for bit those of
the step before it was shared. The CUDA one is ``_device_backend.DeviceBackend``.

Thread safety: :meth:`Backend.stage` runs in the place thread, everything else in the train thread.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..comm import fold
from ..errors import InternalError

__all__ = ["Backend", "RowAccess", "HostBackend", "HostInputs"]


class RowAccess(Protocol):
    """The resident rows of one mini-batch, from :meth:`Backend.rows` (valid inside its ``with``)."""

    def stage_keys(self, keys: np.ndarray):
        """Host keys (n,) uint64 (e.g. the reduced keys of a sparse all-reduce) -> the form ``find``
        takes (device keys, partitioned on the device with several HBM-PS parts; ``mpi`` bytes)."""

    def find(self, keys) -> "Found":
        """Find the resident rows of ``keys`` (staged, distinct). A key that is not resident is a
        residency bug: reported at once (CPU) or counted and reported at the end of the batch (GPU)."""

    def gather(self, found: "Found", idx, cols: int):
        """(m, cols) xp: columns ``:cols`` of the rows of ``found`` at ``idx`` (m,) int64 (staged;
        None = every row in order)."""

    def update(self, found: "Found", grads, opt) -> None:
        """One step of the row optimizer ``opt`` on the rows of ``found`` with ``grads`` (u, P) xp,
        each key's gradient summed over the global mini-batch. In place in the HBM-PS."""


class Backend(Protocol):
    """See the module docstring. ``xp``: the array module of the step's arrays; ``switch_interval``:
    the GIL switch interval training runs at unless ``--gil-switch-interval`` says (None: Python's)."""

    xp: object
    switch_interval: float | None

    def wrap(self, table):
        """The HBM-PS ``table`` as the hierarchy uses it (host arrays in and out)."""

    def stage(self, local, plans: list, table) -> list:
        """Per mini-batch inputs of a batch (``local``: its LocalBatch; ``plans``: its ``_sync.Plan``
        list) for :meth:`forward_backward`; place stage. Blocking."""

    def rows(self, table):
        """``with backend.rows(table) as R:`` a :class:`RowAccess`; rows found inside stay valid
        until the block ends (the GPU holds the table's lock)."""

    def forward_backward(self, params, inputs, n_total: int):
        """Forward and backward of this rank's share of a global mini-batch of ``n_total`` examples
        over ``params`` (u, P) xp, the rows ``inputs.inv`` indexes -> (grads (u, P) xp, dense
        gradients {name: xp array}). The loss is accounted for the batch. REQUIRES: inside
        :meth:`rows` (its kernels run under the table's lock, which also keeps Numba's CUDA simulator,
        which runs one thread's kernels at a time, away from the place stage's)."""

    def forward_backward_resident(self, R: RowAccess, found, inputs, n_total: int):
        """:meth:`forward_backward` over the resident rows ``found`` (pooled straight from them)."""

    def to_host(self, a, purpose: str = "mpi"):
        """Host copy of the device array ``a`` (the CPU: ``a`` itself), counted as ``purpose``."""

    def to_device(self, a, purpose: str = "mpi"):
        """Device copy of the host array ``a`` (the CPU: ``a`` itself), counted as ``purpose``."""

    def begin_batch(self, table, staged=None) -> None:
        """Train stage, before a batch's first step; ``staged``: its :meth:`stage` output or None (the device
        orders its train stream after the place stage's work on them)."""

    def end_minibatch(self) -> None: ...

    def minibatch_loss(self) -> float:
        """This rank's loss term of the last mini-batch (sum of its BCE / n_total)."""

    def end_batch(self, table) -> float:
        """This rank's sum of per-example losses of the batch. Raises InternalError when keys were
        missing from the HBM-PS."""

    def transfers(self):
        """The ledger's metrics (None: nothing crossed, the CPU)."""


@dataclass
class HostInputs:
    """One local mini-batch's inputs on the CPU: ``batch`` (its examples, a host Batch), ``inv`` (nnz,)
    int64 into the rows of ``keys``, ``keys`` the keys whose rows this rank reads and updates
    (``Plan.ukeys`` in owner mode with several ranks, ``Plan.keys`` otherwise) and ``uinv`` the index
    into ``keys`` of every key other ranks asked (owner mode, several ranks; else None); ``hot`` the
    mini-batch's FAE hot slots (``Plan.hot_slots``); ``shards`` (S + 1,) int64 the bounds of this
    rank's S shards' examples in ``batch`` (``LocalBatch.shard_bounds``; None: one shard)."""

    batch: object
    inv: np.ndarray
    keys: np.ndarray
    uinv: np.ndarray | None
    hot: np.ndarray | None = None
    shards: np.ndarray | None = None


@dataclass
class Found:
    """Rows found on the CPU: ``keys`` (u,), a copy of their rows (u, row_width), the step's own, and
    the slots they were found at (``HashTable.find_rows``: the update writes there, probing nothing)."""

    keys: np.ndarray
    rows: np.ndarray
    slots: np.ndarray


class _HostRows:
    """:class:`RowAccess` over the CPU twin of the HBM-PS (a host ``HashTable``)."""

    def __init__(self, table):
        self.table = table

    def stage_keys(self, keys):
        return keys

    def find(self, keys) -> Found:
        rows, slots = self.table.find_rows(keys)   # keys the prepare stage's lookup validated
        if slots.shape[0] and int(slots.min()) < 0:
            raise InternalError(f"{int((slots < 0).sum())} working-set keys are missing from HBM-PS (residency bug)")
        return Found(keys, rows, slots)

    def gather(self, found: Found, idx, cols: int):
        return found.rows[:, :cols] if idx is None else found.rows[idx, :cols]

    def update(self, found: Found, grads, opt) -> None:
        self.table.write_rows(found.keys, found.slots, opt.apply_in_place(found.rows, grads))  # its own copy


class HostBackend:
    """:class:`Backend` of ``--device cpu``: NumPy arrays, the model's CPU kernels, nothing staged.
    ``model``: the FieldModel (built over NumPy)."""

    xp = np
    switch_interval = None

    def __init__(self, model):
        self.model = model
        self._loss = 0.0
        self._last = 0.0

    def wrap(self, table):
        return table

    def stage(self, local, plans: list, table) -> list:
        return [HostInputs(local.minibatch(j), p.inv, p.keys if p.uinv is None else p.ukeys, p.uinv, p.hot_slots,
                           local.shard_bounds(j)) for j, p in enumerate(plans)]

    def rows(self, table):
        return contextlib.nullcontext(_HostRows(table))

    def forward_backward(self, params, inputs: HostInputs, n_total: int):
        if inputs.shards is None:
            loss, _, g_rows, g_dense = self.model.forward_backward(params, inputs.inv, inputs.batch, n_total=n_total)
        else:
            loss, g_rows, g_dense = self._by_shard(params, inputs, n_total)
        self._last = loss
        self._loss += loss * n_total
        return g_rows, g_dense

    def _by_shard(self, params, inputs: HostInputs, n_total: int):
        """One forward/backward per shard — each exactly the call of the rank that would read it alone —
        and their gradients folded in shard order (``hps.comm.fold``), as the ranks' ordered reductions
        add theirs (DESIGN.md, "Reductions have a fixed order"): N ranks equal one process reading N
        shards bit for bit. -> (loss, grad rows (u, P), dense gradients)."""
        b, off, inv = inputs.batch, inputs.batch.offsets, inputs.inv
        bounds = [(int(a), int(e)) for a, e in zip(inputs.shards[:-1], inputs.shards[1:]) if e > a] or [(0, 0)]
        loss, rows, dense = 0.0, [], []
        for a, e in bounds:
            lo, _, g, gd = self.model.forward_backward(params, inv[off[a]:off[e]], b.slice(a, e), n_total=n_total)
            loss, rows, dense = loss + lo, rows + [g], dense + [gd]
        return loss, fold(rows), {k: fold([gd[k] for gd in dense]) for k in dense[0]}

    def forward_backward_resident(self, R, found: Found, inputs: HostInputs, n_total: int):
        return self.forward_backward(found.rows[:, :self.model.row_params], inputs, n_total)

    def to_host(self, a, purpose: str = "mpi"):
        return a

    def to_device(self, a, purpose: str = "mpi"):
        return a

    def begin_batch(self, table, staged=None) -> None:
        self._loss = 0.0

    def end_minibatch(self) -> None:
        pass

    def minibatch_loss(self) -> float:
        return self._last

    def end_batch(self, table) -> float:
        return self._loss

    def transfers(self):
        return None
