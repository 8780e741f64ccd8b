"""How the ranks keep the embedding rows of a batch in step (``--sparse-sync``).

Both strategies split their work between the prepare stage (:meth:`plan`: who needs which keys,
which keys this rank must hold resident) and the train stage (:meth:`step`: one mini-batch), and
apply one optimizer step per key per global mini-batch to the summed gradient of the key.

``owner`` (:class:`OwnerSync`, the default): row-wise sharding, owner computes. Only a key's owner
(``hps.mem.owner_of``) holds its row. In the prepare stage every rank sends the unique keys of each
of its local mini-batches to their owners (one alltoallv per batch); an owner makes the union of the
keys asked of it resident. Per mini-batch, owners send the embedding part of the asked rows to the
ranks that asked (alltoallv), every rank runs forward/backward on its own examples, sends the
per-key gradient sums back to the owners (alltoallv, the same layout), and each owner sums the
contributions of each key in rank order and applies the optimizer once. Rows never have replicas,
so they cannot diverge, and the owner ends with the final row.

``allreduce`` (:class:`ReplicaSync`, Appendix C.3): every rank holds the working set of the whole
global batch resident (found by gathering every rank's unique keys, not by parsing), sums the
gradients with the hierarchical sparse all-reduce and applies every update to its replica, so all
replicas stay bit-identical. Per-rank memory and update work do not fall with the number of ranks.

Thread safety: :meth:`plan` runs in the prepare thread, :meth:`step` in the train thread; each uses
only its own channel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._hashing import group_by_owner
from ..comm import SPARSE_GRADS, SPARSE_KEYS, SPARSE_ROWS, Compression
from ..comm._kernels import segment_sum
from ..errors import InternalError
from ..mem import unique_counts
from ._hierarchy import _host

SPARSE_SYNCS = ("owner", "allreduce")


def unique_inverse(keys):
    """(distinct keys in first-occurrence order, inverse (n,) int64) — hashing, not sorting."""
    u, _, inv = unique_counts(keys)
    return u, inv


@dataclass
class Plan:
    """One local mini-batch, planned in the prepare stage.

    Asking side: ``keys`` (u,) the unique keys of this rank's examples — in owner mode grouped by
    owner, ``send`` (size,) keys per owner, so rows arrive and gradients leave in this order with no
    reshuffle — and ``inv`` (nnz,) their index per key occurrence. Owner side (owner mode): ``ukeys``
    (v,) the owned keys anyone asked for in this global mini-batch, ``uinv`` (m,) the index into
    ``ukeys`` of every key asked (grouped by asking rank) and ``recv`` (size,) keys asked per rank.
    With one rank ``uinv`` is None (``ukeys`` is ``keys``).

    FAE (``_fae``): ``keys`` are the cold keys only; ``hot_slots`` (h,) the mini-batch's pinned hot
    rows, and ``inv`` indexes ``[keys | hot rows]``. None without FAE.
    """

    keys: np.ndarray
    inv: np.ndarray
    send: np.ndarray | None = None
    ukeys: np.ndarray | None = None
    uinv: np.ndarray | None = None
    recv: np.ndarray | None = None
    hot_slots: np.ndarray | None = None


def _plans(local, hot) -> list[Plan]:
    """One Plan per local mini-batch of ``local``: its unique keys (the cold ones with FAE ``hot``)."""
    plans = []
    for j in range(len(local.bounds) - 1):
        keys, inv = unique_inverse(local.minibatch(j).keys)
        if hot is None:
            plans.append(Plan(keys, inv))
        else:
            keys, inv, slots = hot.divide(keys, inv)
            plans.append(Plan(keys, inv, hot_slots=slots))
    return plans


class _Sync:
    def __init__(self, coll, model, sparse_opt, row_params: int, xp, compress=None):
        self.coll = coll
        self.compress = compress or Compression("none")  # --compress: rows and gradients to/from owners
        self.model = model
        self.opt = sparse_opt
        self.row_params = row_params
        self.xp = xp

    def _rows(self, hbm, keys, index: int):
        rows, found = hbm.get(keys)
        if not found.all():
            raise InternalError(f"batch {index}: {int((~found).sum())} working-set keys are missing from "
                                "HBM-PS (residency bug)")
        return _host(rows)

    def _with_hot(self, params, p: Plan, hot):
        """(u, P) parameters of ``[p.keys | hot rows]``: the cold ones and the pinned hot rows."""
        if hot is None or p.hot_slots is None or not p.hot_slots.shape[0]:
            return params
        return np.concatenate([_host(params), hot.rows(p.hot_slots)[:, :self.row_params]])

    def _hot_step(self, g, n_cold: int, p: Plan, hot):
        """Cold gradient rows of ``g``; the hot ones go to the hot rows' all-reduce (collective)."""
        if hot is None:
            return g
        slots = p.hot_slots if p.hot_slots is not None else np.empty(0, np.int64)
        if hot.size:
            hot.step(slots, g[n_cold:], self.coll.train)
        return g[:n_cold]


class OwnerSync(_Sync):
    """``--sparse-sync owner``: see the module docstring."""

    replicated = False

    def plan(self, local, hot=None) -> tuple[np.ndarray, list[Plan]]:
        """(keys this rank must hold resident for the batch, one Plan per local mini-batch) for the
        LocalBatch ``local``; FAE ``hot`` rows (``_fae.HotRows``) are left out. Collective over the
        prepare channel (one alltoall, one alltoallv)."""
        P, size = len(local.bounds) - 1, self.coll.size
        plans = _plans(local, hot)
        if size == 1:
            for p in plans:
                p.ukeys = p.keys
            allk = np.concatenate([p.keys for p in plans]) if plans else np.empty(0, np.uint64)
            return unique_inverse(allk)[0], plans
        ranks = np.arange(size, dtype=np.int32)
        for p in plans:  # keys grouped by owner, inv pointing at the regrouped keys
            order, offsets = group_by_owner(self.coll.owner(p.keys), size)
            where = np.empty(order.shape[0] + _n_hot(p), np.int64)
            where[order] = np.arange(order.shape[0])
            where[order.shape[0]:] = np.arange(order.shape[0], where.shape[0])  # hot rows stay last
            p.keys, p.inv, p.send = p.keys[order], where[p.inv], np.diff(offsets)
        # one message per owner: its keys of mini-batch 0, then of mini-batch 1, ...
        flat_keys = np.concatenate([p.keys for p in plans])
        by_owner, offsets = group_by_owner(np.concatenate([np.repeat(ranks, p.send) for p in plans]), size)
        counts = np.stack([p.send for p in plans], axis=1)                  # (size, P) keys per owner and mb
        ch = self.coll.prepare
        asked_counts = ch.alltoall_counts(counts)                            # (size, P) from each rank
        asked = ch.alltoallv(flat_keys[by_owner], np.diff(offsets), asked_counts.sum(axis=1), SPARSE_KEYS)
        # regroup what was asked by mini-batch (asking ranks in rank order inside each)
        block = np.repeat(np.tile(np.arange(P, dtype=np.int32), size), asked_counts.ravel())
        by_mb, mb_offsets = group_by_owner(block, P)
        asked = asked[by_mb]
        for j, p in enumerate(plans):
            p.ukeys, p.uinv = unique_inverse(asked[mb_offsets[j]:mb_offsets[j + 1]])
            p.recv = asked_counts[:, j].copy()
        return unique_inverse(asked)[0], plans

    def step(self, hbm, index: int, p: Plan, share, n_total: int, hot=None, hot_only: bool = False):
        """One mini-batch: serve the asked rows, forward/backward on ``share``, send the gradients to
        their owners, apply the owned updates. Returns (loss term, dense gradients). Collective over
        the train channel (two alltoallv; FAE: then the hot rows' all-reduce, and a ``hot_only``
        mini-batch — all-hot on every rank — skips the alltoallv)."""
        P, ch = self.row_params, self.coll.train
        if hot_only:
            rows = params = np.empty((0, P), np.float32)
        else:
            rows = self._rows(hbm, p.ukeys, index)                           # (v, row_width) owned rows
            if p.uinv is None:
                params = rows[:, :P]
            else:  # (u, P) rows of p.keys: they arrive grouped by owner, the order of p.keys
                params = self.compress.exchange_rows(ch, rows[p.uinv, :P], p.recv, p.send, SPARSE_ROWS)
        loss, _, g_rows, g_dense = self.model.forward_backward(self.xp.asarray(self._with_hot(params, p, hot)),
                                                              p.inv, share, n_total=n_total)
        g = self._hot_step(_host(g_rows), p.keys.shape[0], p, hot)
        if hot_only:
            return loss, g_dense
        if p.uinv is not None:
            back = self.compress.exchange_grads(ch, g, p.send, p.recv, SPARSE_GRADS)  # aligned with p.uinv
            g = segment_sum(back, p.uinv, p.ukeys.shape[0])                  # rank order: deterministic
        hbm.insert(p.ukeys, _host(self.opt.apply_in_place(rows, g)))  # rows: this step's own copy
        return loss, g_dense


class ReplicaSync(_Sync):
    """``--sparse-sync allreduce``: see the module docstring."""

    replicated = True

    def plan(self, local, hot=None) -> tuple[np.ndarray, list[Plan]]:
        """(the global batch's working set, one Plan per local mini-batch; FAE ``hot`` rows left
        out). Collective over the prepare channel (one allgatherv of every rank's unique keys)."""
        plans = _plans(local, hot)
        mine = unique_inverse(local.data.keys)[0]
        if hot is not None:
            mine = mine[~hot.mask(mine)]
        return unique_inverse(self.coll.prepare.allgatherv(mine, SPARSE_KEYS))[0], plans

    def step(self, hbm, index: int, p: Plan, share, n_total: int, hot=None, hot_only: bool = False):
        P = self.row_params
        rows = np.empty((0, P), np.float32) if hot_only else self._rows(hbm, p.keys, index)
        loss, _, g_rows, g_dense = self.model.forward_backward(self.xp.asarray(self._with_hot(rows[:, :P], p, hot)),
                                                              p.inv, share, n_total=n_total)
        g = self._hot_step(_host(g_rows), p.keys.shape[0], p, hot)
        if hot_only:
            return loss, g_dense
        keys, grads = self.coll.train.sparse_allreduce(p.keys, g)
        if keys is not p.keys:
            rows = self._rows(hbm, keys, index)
        hbm.insert(keys, _host(self.opt.apply_in_place(rows, grads)))  # rows: this step's own copy
        return loss, g_dense


def _n_hot(p: Plan) -> int:
    return 0 if p.hot_slots is None else int(p.hot_slots.shape[0])


def make_sync(mode: str, *args, compress=None):
    return {"owner": OwnerSync, "allreduce": ReplicaSync}[mode](*args, compress=compress)
