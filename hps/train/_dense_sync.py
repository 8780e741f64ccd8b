"""How the ranks keep the dense parameters in step (``--dense-sync``, ``--compress``): the one place that
sees a mini-batch's dense gradients.

``allreduce`` (:class:`DenseSync`, the default, BSP): the dense gradients of every global mini-batch
are flattened (on the step's device), staged to the host, summed over all ranks
(``Channel.dense_allreduce``, or bfloat16 on the wire with ``--compress bf16``/``int8``:
``hps.comm.Compression``), staged back, and every rank takes the same optimizer step: one dense copy.
With one rank nothing is flattened: the optimizer steps the gradients as the model returned them.

Without compression, on the host, each rank steps only its block of the flattened dense parameters and
the allgather carries stepped parameters (``_dense_shard``: ZeRO stage 1, the same bytes; :attr:`fuses`).
With ``--sparse-sync owner`` both ride in the sparse sync's exchanges (``_sync``, "fused"): the
reduce-scatter's blocks in the sparse gradients' alltoallv (:meth:`begin_fused`, :meth:`finish_fused`:
folded in rank order, this rank's block stepped), the allgather of the stepped blocks in the next
mini-batch's rows alltoallv (:meth:`take_gather`, :meth:`put_gather`), so a mini-batch waits twice, not
four times. Until then the other ranks' blocks of the parameters are a step old: whatever else reads
them first completes the allgather on its own (:meth:`flush`, collective, the same on every rank:
an all-hot mini-batch, the end of every batch — before evaluations, checkpoints, exports and the end
of training — and a step of the unfused path); riders need their sums at once, so with a rider that
can leave a buffer (FAE's hot rows) the allgather runs right after the step. With ``--sparse-sync
allreduce`` the sparse sync calls :meth:`DenseSync.begin` as soon as a mini-batch's dense gradients
(and the riders' buffers) are ready: their reduce-scatter runs while the sparse gradients are summed
(as PyTorch DDP starts a bucket's all-reduce during the backward pass, Li et al., VLDB 2020,
§3.2.3), and :meth:`DenseSync.step` waits for it and runs the allgather. HET's step does not begin it
early: its dense sync runs whole in :meth:`DenseSync.step`, after the sparse work. The model's host backward runs in
chunks of examples, each through every layer (``hps.model._chunks``), so no layer's gradient is whole
before the last chunk ends: the dense gradients are one bucket, ready at the end of the backward.

``easgd`` (``_easgd.EasgdSync``): groups of ranks, one dense copy each, averaged in the background
(Hierarchical Training).

**Riders.** A rider (``add_rider``; FAE's fused hot rows) leaves a host buffer (``take_pending()``) that
is summed in the same all-reduce as the dense gradients, appended to them, and gets the sum back
(``apply(summed)``): one collective per mini-batch instead of two.

Thread safety: the train thread calls every method.
"""

from __future__ import annotations

import numpy as np

from ..comm import Compression
from ..comm._ordered import fold_parts
from ..errors import InternalError, InvalidInputError
from ..model import flat_of, flat_views
from ._dense_shard import DenseShard
from ._features import Feature

#: Group of the dense sync's state in each rank's checkpoint file (``_checkpoint.save(extra=...)``;
#: EASGD's group copies). Written to disk: never rename.
CKPT_GROUP = "easgd"


def check_groups(g, groups: int) -> None:
    """The checkpoint group ``g`` (or None: one dense copy) was written with ``groups`` dense groups;
    else InvalidInputError."""
    have = int(g.attrs["groups"]) if g is not None else 1
    if have != groups:
        raise InvalidInputError(f"the checkpoint was written with {have} dense group(s) (--groups, "
                                f"--dense-sync); resume with the same, not {groups}")


class DenseSync(Feature):
    """``--dense-sync allreduce``. ``coll``: Collectives; ``params``: the model's dense parameters
    (name -> xp array, updated in place); ``dense_opt``: their optimizer; ``backend``: the train step's
    backend (``xp``, ``to_host``, ``to_device``: the staging of what MPI carries); ``compress``: the
    codec of the all-reduce; ``mode``: the ``--dense-sync`` it stands for (``easgd`` with one group is
    this job exactly). Construction compiles the codecs with several ranks (cached on disk). A feature
    (``_features``) of its own: EASGD's state plugs into checkpoints and the end of training through
    its hooks."""

    name = "dense_sync"

    def __init__(self, coll, params: dict, dense_opt, backend, compress: Compression | None = None,
                 mode: str = "allreduce"):
        self.coll, self.params, self.dense_opt, self.be, self.mode = coll, params, dense_opt, backend, mode
        self.compress = compress or Compression("none")
        self.G = 1
        self._riders = []
        self._started = None  # (the gradients begin() took, their riders, the shard's handle)
        self._fused = None    # (the gradients begin_fused() took, their riders, the shard's buffers)
        self._stepped = None  # the gradients finish_fused() stepped with: step() has nothing left to do
        self._gather = None   # (this rank's stepped block, the shard's buffers): the allgather deferred
        if coll.size > 1:
            self.compress.warm_up()  # compile the codecs before the timed training (cached on disk)
        # one dense copy summed exactly, on the host: each rank steps its block of it (ZeRO stage 1)
        sharded = type(self) is DenseSync and coll.size > 1 and self.compress.dense == "none" and backend.xp is np
        self.shard = DenseShard(params, dense_opt, coll.size, coll.rank) if sharded else None

    def add_rider(self, rider) -> None:
        """Sum ``rider``'s pending buffer (``take_pending() -> (k,) float32 host or None``) with the dense
        gradients and hand it the sum (``apply(summed)``). ``rider.size``: 0 when it never leaves a buffer
        (FAE without hot rows); else the fused step never defers its allgather (module docstring)."""
        self._riders.append(rider)

    def _take_riders(self) -> list:
        """[(rider, its pending (k,) float32 buffer)] of the riders with one this mini-batch."""
        return [(r, buf) for r in self._riders if (buf := r.take_pending()) is not None]

    def begin(self, grads: dict) -> None:
        """Start summing a mini-batch's dense gradients ``grads`` (name -> host array) with the riders'
        pending buffers, without waiting; :meth:`step` with the same ``grads`` finishes. Only the sharded
        step starts early (elsewhere nothing happens here). Collective over the train channel: every
        rank calls it at the same point of the step, or none does."""
        if self.shard is None or self._started is not None:
            return
        self.flush()
        riders = self._take_riders()
        bufs = np.concatenate([buf for _, buf in riders]) if riders else np.empty(0, np.float32)
        self._started = (grads, riders, self.shard.begin(self.coll.train, grads, bufs))

    def step(self, grads: dict, n_local: int, n_total: int) -> None:
        """Sum the dense gradients ``grads`` (name -> xp, of this rank's ``n_local`` examples of a global
        mini-batch of ``n_total``) as the strategy says and take the optimizer step. Collective over
        the train channel (or the rank's group)."""
        if self.shard is not None:
            if self._stepped is not None:  # the sparse sync's exchange carried it (begin_fused)
                if self._stepped is not grads:
                    raise InternalError("the dense sync stepped one mini-batch's gradients and was asked to step "
                                        "another's")
                self._stepped = None
                self.after_step()
                return
            self.begin(grads)
            self._sharded(grads)
            return
        if self.coll.size > 1:
            flat = flat_of(grads)  # the pass's gradients in one buffer already (``hps.model._flat``)
            names = list(grads) if flat is None else [k for k, _ in grads.layout]   # the buffer's order
            flat = self.be.to_host(self.be.xp.concatenate([grads[k].ravel() for k in names]) if flat is None else flat)
            n = flat.shape[0]
            riders = self._take_riders()
            if riders:  # one all-reduce of [dense gradients | riders' buffers]
                flat = np.concatenate([flat] + [buf for _, buf in riders])
            flat = self._allreduce(flat, n_local, n_total)
            if flat is None:  # this rank's group had no example in the mini-batch
                self.after_step()
                return
            off = n
            for r, buf in riders:
                r.apply(flat[off:off + buf.shape[0]])
                off += buf.shape[0]
            summed = flat_views(self.be.xp, {k: grads[k].shape for k in names}, flat.dtype,
                                self.be.to_device(flat[:n]))
            grads.update(summed)  # the caller's dict holds the sums, as the optimizer steps them: one buffer
            grads = summed
        self.dense_opt.step(self.params, grads)
        self.after_step()

    def _sharded(self, grads: dict) -> None:
        """The step of ``_dense_shard`` begun by :meth:`begin`: wait for the reduce-scatter, step this
        rank's block, allgather."""
        started, self._started = self._started, None
        if started[0] is not grads:
            raise InternalError("the dense sync began one mini-batch's gradients and was asked to step another's")
        riders = started[1]
        summed = self.shard.finish(self.coll.train, self.params, started[2])
        off = 0
        for r, buf in riders:
            r.apply(summed[off:off + buf.shape[0]])
            off += buf.shape[0]
        self.after_step()

    # -- the fused protocol (``_sync.OwnerSync``): see the module docstring ---------------------------------
    @property
    def fuses(self) -> bool:
        """Whether the sparse sync's exchanges may carry this dense sync's reduce-scatter and allgather (the
        sharded step: one dense copy, several ranks, uncompressed, on the host). The same on every rank."""
        return self.shard is not None

    def begin_fused(self, grads: dict, blocks) -> None:
        """Write the message of the dense gradients ``grads`` and the riders' pending buffers into the view
        ``blocks(w)`` gives ((size, w) float32, row r for rank r: ``Channel.start_blocks``): what the sparse
        gradients' alltoallv carries; :meth:`finish_fused` takes the blocks that arrive. Local. REQUIRES
        :attr:`fuses` and no step in flight (a deferred allgather taken first: :meth:`take_gather`)."""
        if self._gather is not None or self._fused is not None:
            raise InternalError("the dense sync began a fused step with a step of its own in flight")
        self.shard.check(self.params)  # before the collective: may raise
        riders = self._take_riders()
        buf = np.concatenate([b for _, b in riders]) if riders else np.empty(0, np.float32)
        self.shard.write(grads, buf, blocks(self.shard.width(buf.shape[0])))
        self._fused = (grads, riders, buf.shape[0])

    def finish_fused(self, parts: np.ndarray) -> None:
        """The blocks of :meth:`begin_fused`'s message arrived (``parts`` (size, w) float32, row s from rank
        s): fold them in rank order (the bits of the separate reduce-scatter), step this rank's block. With
        riders their sums are needed now: the allgather runs at once (collective); without, it waits for
        the next rows exchange (:meth:`take_gather`) or :meth:`flush`. :meth:`step` with the same gradients
        then only counts."""
        grads, riders, k = self._fused
        self._fused = None
        mine = fold_parts(parts)                                  # (m + mr,) summed in rank order
        self.shard.step_block(mine)
        self._stepped = grads
        if not riders and not any(r.size for r in self._riders):  # no rider's sum, now or in this job
            self._gather = mine
            return
        every = self.coll.train.allgather_chunks(mine, self.shard.buffers(mine.shape[0])[2])
        summed, off = self.shard.put(self.params, every, k), 0
        for r, buf in riders:
            r.apply(summed[off:off + buf.shape[0]])
            off += buf.shape[0]

    def take_gather(self) -> np.ndarray | None:
        """This rank's stepped block (w,) float32 of the allgather :meth:`finish_fused` deferred, or None:
        the next rows exchange carries it to every rank (the same decision on every rank) and hands what
        arrives to :meth:`put_gather` before anything reads the parameters."""
        return self._gather

    def put_gather(self, every: np.ndarray) -> None:
        """The deferred allgather's blocks arrived (``every`` (size, w) float32, row r from rank r): into
        the parameters."""
        self._gather = None
        self.shard.put(self.params, every, 0)

    def flush(self) -> None:
        """Complete a deferred allgather on its own (collective over the train channel; nothing when none
        is pending, the same on every rank): before anything but the next rows exchange reads the dense
        parameters — an all-hot mini-batch, the end of a batch (evaluation, checkpoints, export, the end
        of training), a step of the unfused path."""
        mine = self._gather
        if mine is not None:
            self.put_gather(self.coll.train.allgather_chunks(mine, self.shard.buffers(mine.shape[0])[2]))

    def end_batch(self, w) -> None:
        """A batch was trained: the dense parameters are whole before its evaluations, checkpoints and
        the end of training read them (:meth:`flush`; collective)."""
        self.flush()

    def finish(self) -> None:
        self.flush()

    def save(self, w, ckpt) -> None:
        """Before a checkpoint: the dense parameters whole (:meth:`flush`), the dense optimizer gets every
        rank's block of its state. Collective."""
        if self.shard is not None:
            self.flush()
            self.shard.gather(self.coll.train)

    def restore(self, meta: dict) -> None:
        """After a checkpoint was loaded: this rank takes its block of the dense optimizer's state."""
        if self.shard is not None:
            self.shard.scatter(self.params)

    def _allreduce(self, flat: np.ndarray, n_local: int, n_total: int):
        """The summed gradient (host) this rank's copy steps with, or None for no step."""
        return self.compress.allreduce_dense(self.coll.train, flat)

    def after_step(self) -> None:
        """After every global mini-batch (stepped or not): EASGD's rounds (``_easgd``)."""

    def read_checkpoint(self, h) -> None:
        """One dense copy: refuses a checkpoint written with several groups."""
        check_groups(h.get(CKPT_GROUP), 1)

    def metrics(self, per_rank: list) -> dict:
        return {"dense_sync": self.mode, "groups": self.G, "easgd_alpha": None, "easgd_rounds": 0,
                "easgd_wait_seconds": 0.0, "compress": self.compress.mode}
