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

The dense sync's traffic rides in these two exchanges when it fuses (``DenseSync.fuses``: one dense
copy stepped in blocks, ZeRO-1, uncompressed, on the host — the default with several CPU ranks): the
message to rank r of the gradients' alltoallv is ``[dense block r | gradient rows for owner r]``, so
the dense reduce-scatter arrives with the sparse gradients and rank r folds and steps its block
(``DenseSync.finish_fused``); the message of the next mini-batch's rows alltoallv is ``[my stepped block
| rows asked by r]``, the allgather, written into the parameters before the forward reads them. Two
collectives (two waits) per mini-batch instead of four (rows, reduce-scatter, gradients, allgather);
the blocks are folded as the separate reduce-scatter folds them, so the bits are the same. An all-hot
mini-batch (no exchange; the same decision on every rank), the end of a batch (evaluation,
checkpoints, the end of training) and riders' sums (FAE's hot rows) complete the allgather on its own
(``DenseSync.flush``). Every other configuration (``--compress``, ``--dense-sync easgd``, the device)
keeps the dense sync's own collectives, started beside the gradients' exchange (``_dense_sync``).

``allreduce`` (:class:`ReplicaSync`, Appendix C.3): every rank holds the working set of the whole
global batch resident (found by gathering every rank's unique keys, not by parsing), sums the
gradients with a sparse all-reduce in rank order (``hps.comm.ordered_sparse_allreduce``: rows to each
key's owner rank, folded there, then allgathered) and applies every update to its replica, so all
replicas stay bit-identical and equal one process reading the same shards. Per-rank memory and update work do not fall with the number of ranks.

The step is written once over the array module: what differs between ``--device cpu`` and ``cuda``
(where the resident rows are, pooling and the loss, the staging of MPI's buffers) is behind the
backend it is given (``_backend``). FAE's hot rows (``_hot_rows``) join a mini-batch's rows after the
cold ones and train apart (an empty ``HotRows`` without ``--fae``).

Thread safety: :meth:`plan` runs in the prepare thread, :meth:`step` in the train thread; each uses
only its own channel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._hashing import group_by_owner
from ..comm import DENSE_ALLREDUCE, SPARSE_GRADS, SPARSE_KEYS, SPARSE_ROWS, Compression
from ..comm._kernels import segment_sum
from ..mem import DedupScratch, unique_counts, unique_keys, unique_segments
from ._features import Feature


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
    rows, and ``inv`` indexes ``[keys | hot rows]`` (None without hot rows); ``hot_only``: the
    mini-batch is all-hot on every rank (no cold key anywhere: the exchange is skipped).
    """

    keys: np.ndarray
    inv: np.ndarray
    send: np.ndarray | None = None
    ukeys: np.ndarray | None = None
    uinv: np.ndarray | None = None
    recv: np.ndarray | None = None
    hot_slots: np.ndarray | None = None
    hot_only: bool = False


def _plans(local, hot, hot_flags, scratch) -> tuple[list[Plan], np.ndarray]:
    """(one Plan per local mini-batch of ``local``: its unique keys (the cold ones: ``hot.divide``),
    every plan's keys one after the other (u,) uint64): every mini-batch deduplicated in one pass
    (``unique_segments``: views of a few batch-wide arrays, the probing table ``scratch``'s; without
    hot rows the plans' keys are those arrays' views in order, so the second is not a copy)."""
    kb = local.data.offsets[local.bounds]  # key offsets of the mini-batches
    uniq, ub, inv = unique_segments(local.data.keys, kb, scratch)
    plans = []
    for j in range(len(local.bounds) - 1):
        keys, inv_j, slots = hot.divide(uniq[ub[j]:ub[j + 1]], inv[kb[j] - kb[0]:kb[j + 1] - kb[0]])
        plans.append(Plan(keys, inv_j, hot_slots=slots, hot_only=hot_flags is not None and bool(hot_flags[j])))
    if hot.size:
        uniq = np.concatenate([p.keys for p in plans]) if plans else np.empty(0, np.uint64)
    return plans, uniq


class _Sync(Feature):
    """What both BSP strategies share: ``coll`` the job's Collectives, ``opt`` the row optimizer,
    ``row_params`` P, ``compress`` the codec of rows and gradients on their way to and from owners,
    ``hot`` FAE's pinned hot rows (``_hot_rows.HotRows``; empty without ``--fae``). A feature
    (``_features``) of its own: HET's caches plug into the pipeline through its hooks."""

    name = "sparse_sync"
    mode = ""
    consistency = "bsp"
    #: The dense sync told when a mini-batch's dense gradients are ready (``_build``; None: not told)
    dense = None

    def __init__(self, coll, opt, row_params: int, hot, compress=None):
        self.coll = coll
        self.compress = compress or Compression("none")
        self.opt = opt
        self.row_params = int(row_params)
        self.hot = hot
        self.dedup = DedupScratch()  # the plans' probing tables, kept from batch to batch (prepare thread)

    def metrics(self, per_rank: list) -> dict:
        return {"consistency": self.consistency, "sparse_sync": self.mode}

    def _hot_only(self, be, p: Plan, d, n_total: int):
        """A mini-batch all-hot on every rank: only the hot rows' step (no exchange; the dense sum starts
        in the dense sync's step, next)."""
        P = self.row_params
        if self.dense is not None:  # the dense parameters whole before the forward reads them
            self.dense.flush()
        g, g_dense = be.forward_backward(self.hot.with_params(be.xp.empty((0, P), np.float32), d.hot), d, n_total)
        self.hot.step(p.hot_slots, d.hot, g, self.coll.train)
        return g_dense

    def _dense_ready(self, g_dense) -> None:
        """The mini-batch's dense gradients (and FAE's hot-row buffer riding with them) are whole: the
        dense sync may start summing them now, beside the sparse exchange that follows
        (``DenseSync.begin``). Collective over the train channel."""
        if self.dense is not None:
            self.dense.begin(g_dense)

    def _forward(self, be, R, found, params, d, n_total: int):
        """Forward/backward of this rank's share over the resident rows ``found`` (pooled straight from
        them), or over ``params`` (u, P) xp when given; FAE's hot rows join either after the cold ones.
        -> (per-key gradients (u [+ hot], P) xp, dense gradients)."""
        if params is None and d.hot is None:
            return be.forward_backward_resident(R, found, d, n_total)
        if params is None:
            params = R.gather(found, None, self.row_params)
        return be.forward_backward(self.hot.with_params(params, d.hot), d, n_total)

    def _cold(self, g, n_cold: int, p: Plan, d):
        """Cold gradient rows of ``g``; the hot ones go to the hot rows' step (collective)."""
        self.hot.step(p.hot_slots, d.hot, g[n_cold:], self.coll.train)
        return g[:n_cold]


class OwnerSync(_Sync):
    """``--sparse-sync owner``: see the module docstring."""

    mode = "owner"
    replicated = False

    def plan(self, local, hot_flags=None) -> tuple[np.ndarray, list[Plan]]:
        """(keys this rank must hold resident for the batch, one Plan per local mini-batch) for the
        LocalBatch ``local`` (``hot_flags`` (P,) bool: FAE's all-hot mini-batches); hot rows are left
        out. Collective over the prepare channel (one alltoall, one alltoallv)."""
        P, size = len(local.bounds) - 1, self.coll.size
        plans, allk = _plans(local, self.hot, hot_flags, self.dedup)
        if size == 1:
            for p in plans:
                p.ukeys = p.keys
            return unique_keys(allk, self.dedup), plans
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
        uniq, ub, inv = unique_segments(asked, mb_offsets, self.dedup)  # every mini-batch's dedup in one pass
        for j, p in enumerate(plans):
            p.ukeys, p.uinv = uniq[ub[j]:ub[j + 1]], inv[mb_offsets[j]:mb_offsets[j + 1]]  # mb_offsets[0] == 0
            p.recv = asked_counts[:, j].copy()
        return unique_keys(asked, self.dedup), plans

    def step(self, be, table, p: Plan, d, n_total: int):
        """One mini-batch: serve the asked rows, forward/backward on this rank's share (``d``: its
        staged inputs, ``be``: the backend), send the gradients to their owners, apply the owned
        updates in the HBM-PS ``table``. Returns the dense gradients. Collective over the train channel
        (two alltoallv, carrying the dense sync's traffic when it fuses (module docstring); FAE: then
        the hot rows' all-reduce; an all-hot mini-batch skips the exchange)."""
        P, ch = self.row_params, self.coll.train
        with be.rows(table) as R:
            if p.hot_only:
                return self._hot_only(be, p, d, n_total)
            found, params = R.find(d.keys), None                             # owned rows of p.keys
            fused = p.uinv is not None and self.dense is not None and self.dense.fuses
            if p.uinv is not None:  # (u, P) rows of p.keys: they arrive grouped by owner, the order of p.keys
                sent = be.to_host(R.gather(found, d.uinv, P))
                mine = self.dense.take_gather() if fused else None
                if mine is None:
                    params = self.compress.exchange_rows(ch, sent, p.recv, p.send, SPARSE_ROWS)
                else:  # the previous step's allgather rides along: the parameters whole before the forward
                    ch.start_blocks(SPARSE_ROWS, mine.shape[0], P, p.recv, p.send)[...] = mine
                    params, every = ch.alltoallv_blocks(sent, SPARSE_ROWS, DENSE_ALLREDUCE)
                    self.dense.put_gather(every)
                params = be.to_device(params)
            g, g_dense = self._forward(be, R, found, params, d, n_total)
            g = self._cold(g, p.keys.shape[0], p, d)
            if fused:  # the dense reduce-scatter rides in the sparse gradients' exchange
                self.dense.begin_fused(g_dense, lambda w: ch.start_blocks(SPARSE_GRADS, w, P, p.send, p.recv))
                back, parts = ch.alltoallv_blocks(be.to_host(g), SPARSE_GRADS, DENSE_ALLREDUCE)
                self.dense.finish_fused(parts)
            else:
                self._dense_ready(g_dense)
                if p.uinv is not None:
                    back = self.compress.exchange_grads(ch, be.to_host(g), p.send, p.recv, SPARSE_GRADS)
            if p.uinv is not None:  # back: p.uinv order
                g = be.to_device(segment_sum(back, p.uinv, p.ukeys.shape[0]))  # rank order: deterministic
            R.update(found, g, self.opt)
        return g_dense


class ReplicaSync(_Sync):
    """``--sparse-sync allreduce``: see the module docstring."""

    mode = "allreduce"
    replicated = True

    def plan(self, local, hot_flags=None) -> tuple[np.ndarray, list[Plan]]:
        """(the global batch's working set, one Plan per local mini-batch; hot rows left out).
        Collective over the prepare channel (one allgatherv of every rank's unique keys)."""
        plans, allk = _plans(local, self.hot, hot_flags, self.dedup)
        mine = unique_keys(allk, self.dedup)  # the batch's cold keys, first occurrence first
        return unique_keys(self.coll.prepare.allgatherv(mine, SPARSE_KEYS), self.dedup), plans

    def step(self, be, table, p: Plan, d, n_total: int):
        """As :meth:`OwnerSync.step`, the gradients summed by the sparse all-reduce and every update
        applied to every replica. Collective over the train channel."""
        ch = self.coll.train
        with be.rows(table) as R:
            if p.hot_only:
                return self._hot_only(be, p, d, n_total)
            found = R.find(d.keys)
            g, g_dense = self._forward(be, R, found, None, d, n_total)
            g = self._cold(g, p.keys.shape[0], p, d)
            self._dense_ready(g_dense)
            if self.coll.size > 1:  # every replica applies every update
                keys, grads = ch.sparse_allreduce(p.keys, be.to_host(g))
                found, g = R.find(R.stage_keys(keys)), be.to_device(grads)
            R.update(found, g, self.opt)
        return g_dense


def _n_hot(p: Plan) -> int:
    return 0 if p.hot_slots is None else int(p.hot_slots.shape[0])


#: ``--sparse-sync`` -> its strategy.
SYNCS = {"owner": OwnerSync, "allreduce": ReplicaSync}
