"""``--consistency het``: the MPI exchange that carries the HET protocol of ``_het`` in the trainer.

:class:`HetSync` plans like ``OwnerSync`` (each rank's unique keys of a mini-batch go to their owners
in the prepare stage, which makes them resident there) and replaces the per-mini-batch step. Every
message follows the layout of the plan (keys per owner in the order of ``Plan.keys``; owners see them
grouped by asking rank, ``Plan.uinv``), so no key is sent twice. Per mini-batch, in the train channel:

===============  ===========================  =================================================  ===========
message          direction                    payload                                            ``bytes_sent`` kind
===============  ===========================  =================================================  ===========
clock reply      owner -> every asking rank   ``c_g`` of every asked key, int32                  ``het_clocks``
fetch flags      rank -> owners               1 bit per asked key: fetch it or not               ``het_control``
invalidations    rank -> owners               key, ``c_c``, gradient of each invalid entry       ``het_push``
rows             owner -> asking rank         the whole row (parameters and optimizer state)     ``sparse_rows``
                                              and its ``c_g`` of each flagged key
pushes           rank -> owners               key, ``c_c``, gradient: own keys, eager            ``het_push``
                                              invalidations, evictions
===============  ===========================  =================================================  ===========

A push record is ``P + 3`` 32-bit words (gradient, key, clock), sent with the counts first (one
alltoall). A rank's own keys travel to itself (free). :meth:`HetSync.flush` (consistent cuts: every
checkpoint point, written or not, and the end of training) pushes every cache and applies every
pending push. Thread safety: ``plan`` in the prepare thread, everything else in the train thread.
"""

from __future__ import annotations

import numpy as np

from .._hashing import group_by_owner
from ..comm import HET_CLOCKS, HET_CONTROL, HET_PUSH, SPARSE_ROWS
from ..config import STALENESS_UNBOUNDED
from ._het import HetCache, HetOwner, Pushes
from ._sync import OwnerSync


class HetSync(OwnerSync):
    """See the module docstring. ``capacity`` cache entries, ``staleness`` s, ``policy`` lfu | lru;
    ``window``: the residency window of the hierarchy. :meth:`bind` gives it the residency hierarchy
    (owners update rows there) before the first step.

    On ``--device cuda`` the caches and the owner's bookkeeping stay host structures: the rows an owner
    serves are gathered from the HBM-PS and the rows a step uses go up to the device (``mpi`` bytes),
    and pushes update the owner's rows through the hierarchy (``fetch``/``writeback`` bytes)."""

    consistency = "het"

    def __init__(self, coll, opt, row_params: int, hot, *, row_width: int, capacity: int, staleness: int,
                 policy: str, window: int, checkpoint_every: int):
        super().__init__(coll, opt, row_params, hot)
        self.W, self.window, self.every = int(row_width), int(window), int(checkpoint_every)
        self.cache = HetCache(capacity, row_width, row_params, staleness, policy, opt)
        self.owner = HetOwner(opt, row_params)
        self.hier = None

    def start(self, job) -> None:
        self.hier = job.hier  # owners update their rows wherever they live

    def is_cut(self, index: int, last_in_epoch: bool) -> bool:
        """Whether batch ``index`` ends at a consistent cut: a checkpoint point (the end of an epoch,
        every --checkpoint-every batches), whether or not checkpoints are written, so a run's
        trajectory does not depend on --checkpoint-dir and a resumed run reproduces an uninterrupted one."""
        return last_in_epoch or bool(self.every and (index + 1) % self.every == 0)

    def prepare_horizon(self, w) -> int | None:
        """After a cut nothing is prepared past it: when batch ``w.index - 1`` ended at one, it must be
        trained — and flushed — before ``w`` is prepared (the prepare stage also waits for
        ``w.index - 1 + window``)."""
        return w.index - 1 + self.window if w.batch == 0 or self.is_cut(w.index - 1, False) else None

    def step(self, be, table, p, d, n_total: int):
        """One mini-batch of the HET protocol (module docstring) -> the dense gradients. Collective over
        the train channel. One rank: nothing to cache, the BSP step."""
        if p.uinv is None:
            return super().step(be, table, p, d, n_total)
        P, W, ch, rank = self.row_params, self.W, self.coll.train, self.coll.rank
        self.owner.apply_pending(self.hier, p.ukeys)  # rows this mini-batch asks for are placed now
        c_g = ch.alltoallv(self.owner.clocks(p.ukeys)[p.uinv].astype(np.int32), p.recv, p.send,
                           HET_CLOCKS).astype(np.int64)                          # (u,) aligned with p.keys
        off = np.concatenate([[0], np.cumsum(p.send)])
        remote = np.ones(p.keys.shape[0], np.bool_)
        remote[off[rank]:off[rank + 1]] = False
        slots, fetch, invalid = self.cache.read(p.keys, c_g, remote)
        asked = _unpack(ch.alltoallv(_pack(fetch, p.send), _nbytes(p.send), _nbytes(p.recv), HET_CONTROL), p.recv)
        self._push(invalid)                                                      # Evict(k) before Fetch(k)
        # rows (and their c_g) of the flagged keys, owner -> asking rank, in the order of p.keys
        sel = p.uinv[asked]
        with be.rows(table) as R:  # the served rows, whole (parameters and optimizer state)
            rows = be.to_host(R.gather(R.find(d.keys), be.to_device(sel), W))
        reply = np.empty((sel.shape[0], W + 1), np.uint32)
        reply[:, :W] = np.ascontiguousarray(rows, np.float32).view(np.uint32)
        reply[:, W] = self.owner.clocks(p.ukeys)[sel].astype(np.uint32)
        got = ch.alltoallv(reply, _segment_counts(asked, p.recv), _segment_counts(fetch, p.send), SPARSE_ROWS)
        fetched = np.ascontiguousarray(got[:, :W]).view(np.float32)
        clock = got[:, W].astype(np.int64)
        params = np.empty((p.keys.shape[0], W), np.float32)
        params[fetch] = fetched
        params[~fetch] = self.cache.get(slots[~fetch])
        with be.rows(table):  # kernels run under the table's lock; pushes below take the hierarchy's
            g_rows, g_dense = be.forward_backward(be.to_device(params[:, :P]), d, n_total)
            g = np.ascontiguousarray(be.to_host(g_rows), np.float32)
        # fetched remote keys join the cache (Fetch: c_s = c_c = c_g); own keys push every write
        new = fetch & remote
        slots[new] = self.cache.insert(p.keys[new], fetched[new[fetch]], clock[new[fetch]])
        own = ~remote
        mine = Pushes(p.keys[own], clock[own[fetch]] + 1, g[own])
        self._push(Pushes.concat([mine, self.cache.write(slots[remote], g[remote])]))
        return g_dense

    def end_batch(self, w) -> None:
        """At a consistent cut, :meth:`flush`. Collective over the train channel."""
        if self.is_cut(w.index, w.last_in_epoch):
            self.flush()

    def flush(self) -> None:
        """A consistent cut: every rank pushes its whole cache, every owner applies every push and
        pending push; afterwards the owners' rows hold every update. Collective over the train
        channel; call it from the train stage between batches, with no batch prepared ahead."""
        if self.coll.size == 1:
            return
        self._push(self.cache.drain())
        self.owner.apply_pending(self.hier)

    def _push(self, pushes: Pushes) -> None:
        """Send ``pushes`` to their owners (counts, then records of P + 3 words); every owner applies
        what it received, in rank order. Collective over the train channel."""
        P, ch, n = self.row_params, self.coll.train, len(pushes)
        order, offsets = group_by_owner(self.coll.owner(pushes.keys), self.coll.size)
        send = np.diff(offsets)
        recv = ch.alltoall_counts(send.reshape(-1, 1)).ravel()
        rec = np.empty((n, P + 3), np.uint32)
        rec[:, :P] = np.ascontiguousarray(pushes.grads, np.float32).view(np.uint32)
        rec[:, P:P + 2] = pushes.keys.view(np.uint32).reshape(n, 2)
        rec[:, P + 2] = pushes.clocks.astype(np.uint32)
        got = ch.alltoallv(rec[order], send, recv, HET_PUSH)
        self.owner.apply(self.hier, Pushes(np.ascontiguousarray(got[:, P:P + 2]).view(np.uint64).ravel(),
                                           got[:, P + 2].astype(np.int64),
                                           np.ascontiguousarray(got[:, :P]).view(np.float32)))

    def rank_metrics(self) -> dict:
        """This rank's cache counters (reads of remote keys, hits, misses, invalidations, fetches,
        pushes, evictions) and its capacity."""
        return {**self.cache.stats, "capacity": self.cache.capacity}

    def metrics(self, per_rank: list) -> dict:
        return dict(super().metrics(per_rank), **het_metrics(per_rank, self.cache.s))


def _nbytes(counts: np.ndarray) -> np.ndarray:
    """Bytes of each segment of ``counts`` bits, packed."""
    return (counts + 7) // 8


def _pack(mask: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``mask`` (n,) bool in consecutive segments of ``counts`` -> each segment packed into bytes."""
    ends = np.cumsum(counts)
    return np.concatenate([np.packbits(mask[e - c:e]) for e, c in zip(ends, counts)] + [np.empty(0, np.uint8)])


def _unpack(packed: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_pack` -> (counts.sum(),) bool."""
    ends = np.cumsum(_nbytes(counts))
    return np.concatenate([np.unpackbits(packed[e - b:e], count=c).astype(np.bool_)
                           for e, b, c in zip(ends, _nbytes(counts), counts)] + [np.empty(0, np.bool_)])


def _segment_counts(mask: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(size,) int64: how many of ``mask`` (n,) bool are set in each consecutive segment of ``counts``."""
    c = np.concatenate([[0], np.cumsum(mask, dtype=np.int64)])
    ends = np.cumsum(counts)
    return c[ends] - c[ends - counts]


def het_metrics(per_rank: list, staleness: int) -> dict:
    """Job metrics from every rank's :meth:`HetSync.rank_metrics` (summed; the hit rate over all reads
    of remote keys)."""
    tot = {k: sum(r[k] for r in per_rank) for k in per_rank[0]}
    return {"staleness": "inf" if staleness >= STALENESS_UNBOUNDED else staleness,
            "het_hit_rate": tot["hits"] / tot["reads"] if tot["reads"] else 0.0,
            "het_reads": tot["reads"], "het_hits": tot["hits"], "het_misses": tot["misses"],
            "het_fetches": tot["fetches"], "het_pushes": tot["pushes"],
            "het_invalidations": tot["invalidations"], "het_evictions": tot["evictions"],
            "het_cache_entries": per_rank[0]["capacity"]}
