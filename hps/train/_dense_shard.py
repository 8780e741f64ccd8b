"""One dense copy, its optimizer step divided over the ranks (ZeRO stage 1, Rajbhandari et al., SC 2020,
§5.1 "P_os"): the dense gradients' reduce-scatter leaves rank r with block r of their sum, rank r steps
block r of the flattened parameters with its own block of the optimizer state, and the allgather carries
the stepped parameters instead of the summed gradients. The same bytes as the all-reduce; the dense
optimizer's work and state per rank fall to 1/N.

The dense optimizers are element-wise (``hps.model._dense_optim``), so stepping a block gives the bits
one process gets stepping whole tensors: N ranks still equal one process reading N shards. Layout of a
mini-batch's message (``size`` rows): ``[dense block r (m) | riders' block r (m_r)]``, so a parameter's
block does not move when riders (FAE's hot rows) come and go. Checkpoints see whole tensors: ``gather``
puts every block's state into the job's dense optimizer before a save, ``scatter`` takes this rank's
block after a load.

A mini-batch's step is :meth:`DenseShard.begin` (the message written straight from the gradients into a
reused buffer, its reduce-scatter started without waiting) and :meth:`DenseShard.finish` (wait, step
the block, allgather): the caller overlaps the two with the sparse gradients' exchange
(``_dense_sync.DenseSync.begin``). Or the pieces apart, when the sparse sync's exchanges carry the
blocks (``_dense_sync.DenseSync.begin_fused``): :meth:`write` of the message into the exchange's send
buffer, :meth:`step_block` on the blocks received, folded, :meth:`put` of the allgathered ones. Only
this rank's block of the parameters is read for the step: the previous step's allgather must be in them.

Thread safety: the train thread calls every method (``gather`` from the checkpoint's save, collective).
"""

from __future__ import annotations

import numpy as np

from ..errors import InternalError


def _require_in_place(params: dict, names) -> None:
    """Raise InternalError unless every ``params[name]`` is C-contiguous: the shard reads and writes the
    arrays through flat views (``reshape(-1)``), which would be copies otherwise. Checked where the
    arrays are taken (construction, :meth:`DenseShard.scatter` after a load), never inside a collective
    (a step that finds arrays it was not handed there checks them before it waits)."""
    for name in names:
        if not params[name].flags.c_contiguous:
            raise InternalError(f"dense array {name!r} is not C-contiguous: the dense shard reads and writes it "
                                "in place")


class DenseShard:
    """Rank ``rank`` of ``size``'s block of the flattened ``params`` (name -> host array, in the model's
    order) and of ``dense_opt``'s state. Collective methods run over ``ch`` (the train channel). The
    arrays of ``params`` must be C-contiguous (InternalError otherwise): they are written in place."""

    def __init__(self, params: dict, dense_opt, size: int, rank: int):
        self.names = list(params)
        _require_in_place(params, self.names)
        self.shapes = [params[k].shape for k in self.names]
        self.sizes = [int(params[k].size) for k in self.names]
        self.n, self.p = int(sum(self.sizes)), int(size)
        self.m = -(-self.n // self.p)
        self.lo, self.hi = min(self.n, rank * self.m), min(self.n, (rank + 1) * self.m)
        self.main = dense_opt
        self.opt = type(dense_opt)(**dense_opt._hyper())   # this block's optimizer and state
        offsets = np.cumsum([0, *self.sizes])
        # the parameters cut at the blocks' edges: (name, from, to inside it, block, where in the block), in
        # flat order; a mini-batch's message is written and its allgather read through them, no vector between
        self.cuts = [(k, max(a, r * self.m) - a, min(b, (r + 1) * self.m) - a, r, max(a, r * self.m) - r * self.m)
                     for k, a, b in zip(self.names, offsets[:-1].tolist(), offsets[1:].tolist())
                     for r in range(a // self.m, -(-b // self.m)) if a < b]
        self.pieces = [(k, a, b, at) for k, a, b, r, at in self.cuts if r == rank]  # this rank's block [lo, hi)
        # a block's width m + mr -> the reused (p, m + mr) buffers of a mini-batch in flight: the message, what
        # the reduce-scatter receives, what the allgather receives; and this rank's block of the parameters
        self._bufs: dict = {}
        self._block = np.empty(self.hi - self.lo, np.float32)
        # the parameter arrays the views below were taken from (:meth:`_views`): per cut, its flat piece of the
        # parameter; per piece of this rank's block, (the parameter's piece, the block's)
        self._arrays: tuple = ()
        self._param_views: list = []
        self._block_views: list = []
        self._views(params)

    def _views(self, params: dict) -> list:
        """Per cut, the flat view of its piece of ``params`` (taken again when an array was replaced, e.g. by a
        checkpoint's load: the step writes the arrays it was handed, never stale ones)."""
        arrays = tuple(params[k] for k in self.names)
        if len(arrays) != len(self._arrays) or any(a is not b for a, b in zip(arrays, self._arrays)):
            _require_in_place(params, self.names)
            flat = {k: params[k].reshape(-1) for k in self.names}  # views: C-contiguous
            self._param_views = [flat[k][a:b] for k, a, b, _, _ in self.cuts]
            self._block_views = [(flat[k][a:b], self._block[at:at + b - a]) for k, a, b, at in self.pieces]
            self._arrays = arrays
        return self._param_views

    def check(self, params: dict) -> None:
        """Take the views of ``params`` again if an array was replaced (InternalError if one is not
        C-contiguous): what a step does before its collective."""
        self._views(params)

    def _flat(self, arrays: dict) -> np.ndarray:
        return np.concatenate([np.asarray(arrays[k], np.float32).ravel() for k in self.names])

    def _split(self, flat: np.ndarray):
        off = 0
        for k, shape, size in zip(self.names, self.shapes, self.sizes):
            yield k, flat[off:off + size].reshape(shape)
            off += size

    def begin(self, ch, grads: dict, riders: np.ndarray):
        """Write this rank's message and start its reduce-scatter (not waiting) -> the handle
        :meth:`finish` takes. Collective over ``ch``. The message buffer is reused: one mini-batch in
        flight at a time."""
        bufs = self.message(grads, riders)
        return ch.start_reduce_scatter(bufs[0], bufs[1]), riders.shape[0], bufs

    def width(self, k: int) -> int:
        """Elements of a block of a mini-batch's message with riders' buffers of ``k`` floats: m + mr."""
        return self.m + -(-k // self.p)

    def message(self, grads: dict, riders: np.ndarray) -> tuple:
        """(message, reduce-scatter buffer, allgather buffer), reused (p, m + mr) float32 buffers, the
        message written (:meth:`write`)."""
        bufs = self.buffers(self.width(riders.shape[0]))
        self.write(grads, riders, bufs[0])
        return bufs

    def buffers(self, w: int) -> tuple:
        """The reused (p, w) float32 buffers of blocks of width ``w``: (message, reduce-scatter, allgather)."""
        bufs = self._bufs.get(w)
        if bufs is None:
            bufs = self._bufs[w] = tuple(np.empty((self.p, w), np.float32) for _ in range(3))
        return bufs

    def write(self, grads: dict, riders: np.ndarray, msg: np.ndarray) -> None:
        """Write a mini-batch's message into ``msg`` (p, m + mr) float32, any strides (a view of the buffer
        MPI sends: ``_sync``'s fused exchange): row r = ``[dense block r | riders' block r]``, both
        zero-padded. One copy from the model's arrays, a few slices per cut of the parameters."""
        p, m, k = self.p, self.m, riders.shape[0]
        mr = msg.shape[1] - m
        flat = {name: grads[name].reshape(-1) for name in self.names}
        for name, a, b, r, at in self.cuts:
            msg[r, at:at + b - a] = flat[name][a:b]
        for r in range(max(0, self.n // m), p):                    # the blocks' tails past n
            msg[r, max(0, self.n - r * m):m] = 0
        if mr:  # the riders in rows of mr, the last one's tail zero (k changes at one mr)
            q, rest = divmod(k, mr)
            msg[:q, m:] = riders[:q * mr].reshape(q, mr)
            if q < p:
                msg[q, m:m + rest] = riders[q * mr:]
                msg[q, m + rest:] = 0
                msg[q + 1:, m:] = 0

    def finish(self, ch, params: dict, started) -> np.ndarray:
        """Wait for the reduce-scatter ``started`` (from :meth:`begin`), step this rank's block, allgather
        the stepped blocks into ``params`` (in place) -> the riders' sum (k,). Collective over ``ch``."""
        pending, k, bufs = started
        self._views(params)                                        # before any collective: may raise
        mine = ch.finish_reduce_scatter(pending)                   # (m + mr,) summed in rank order
        self.step_block(mine)
        ch.allgather_chunks(mine, bufs[2])                         # (p, m + mr)
        return self.put(params, bufs[2], k)

    def step_block(self, mine: np.ndarray) -> None:
        """Step this rank's block of the parameters with ``mine`` (m + mr,) float32, its block of the summed
        gradients (and the riders'), in place: ``mine[:hi - lo]`` becomes the stepped parameters, what the
        allgather carries. Reads this rank's block of the parameter arrays: REQUIRES the previous step's
        allgather written into them (``_views`` taken)."""
        w = self.hi - self.lo
        for name, value in self.main._hyper().items():            # e.g. the learning-rate schedule's
            setattr(self.opt, name, value)
        if w > 0:
            block = self._block
            for src, dst in self._block_views:
                dst[...] = src
            self.opt.step({"block": block}, {"block": mine[:w]})
            mine[:w] = block
        self.main.t = self.opt.t

    def put(self, params: dict, every: np.ndarray, k: int) -> np.ndarray:
        """The stepped blocks ``every`` ((p, m + mr) float32, any strides; row r from rank r) into ``params``,
        in place -> the riders' sum (k,)."""
        self._views(params)
        for dst, (_, a, b, r, at) in zip(self._param_views, self.cuts):
            dst[...] = every[r, at:at + b - a]
        return np.ascontiguousarray(every[:, self.m:]).reshape(-1)[:k] if k else every[0, :0]

    def gather(self, ch) -> None:
        """Put every rank's block of the optimizer state into the job's dense optimizer (whole tensors,
        as a checkpoint writes them). Collective over ``ch``."""
        if self.opt.t == 0:
            return
        for slot in self.opt._slots:
            block = np.zeros(self.m, np.float32)
            if self.hi > self.lo:
                block[:self.hi - self.lo] = self.opt._state[slot]["block"]
            every = ch.allgather_chunks(block).reshape(-1)[:self.n]
            self.main._state[slot] = {name: a.copy() for name, a in self._split(every)}
        self.main.t = self.opt.t

    def scatter(self, params: dict) -> None:
        """Take this rank's block of the job's dense optimizer state (after a checkpoint was loaded, which
        may have replaced the arrays of ``params``: they are checked again, InternalError)."""
        self._views(params)  # checks them
        self.opt.t = self.main.t
        for name, value in self.main._hyper().items():
            setattr(self.opt, name, value)
        for slot in self.opt._slots:
            st = self.main._state[slot]
            if self.hi > self.lo and all(name in st for name in self.names):
                self.opt._state[slot]["block"] = self._flat(st)[self.lo:self.hi].copy()
