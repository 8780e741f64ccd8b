"""FAE's pinned hot rows (``seeds/003`` §4.2): a replica of the hot embeddings on every rank, apart from
the residency window, trained by a dense all-reduce of their gradients.

The hot keys (``keys``, ascending) and their rows (``rows`` (h, row_width), an ``xp`` array on the
train step's device: the HBM-PS on ``--device cuda``) are pinned once at the start (:meth:`pin`) and
never evicted. A mini-batch's plan splits its keys into the cold ones, which the sparse sync handles,
and the hot ones (:meth:`divide`); the step appends the hot rows' parameters to the cold ones
(:meth:`with_params`) and hands the hot rows' gradients to :meth:`step`: with one rank the optimizer
steps them at once; with several every rank adds its gradients and touch counts into a dense (h, P + 1)
buffer, the ranks sum it (its own all-reduce, or with ``fused`` inside the dense gradients' one: the
dense sync takes it as a rider, :meth:`take_pending` / :meth:`apply`) and each applies one optimizer
step to every touched row, so the replicas stay identical.

An empty ``HotRows`` (no hot key: every job without ``--fae``) plans every key as cold and steps
nothing. Host <-> device copies go through the step's backend: ``fetch`` (pinning), ``writeback``
(:meth:`write_back`), ``mpi`` (the buffer), ``plan`` (a mini-batch's hot slots, staged with its plan).

Not thread-safe: planning (``mask``, ``divide``) reads only ``keys`` and runs in the read/prepare
threads; everything else in the train thread.
"""

from __future__ import annotations

import numpy as np

from ..profile import hot_mask


class HotRows:
    """See the module docstring. ``opt``: the row optimizer; ``row_params`` P; ``row_width`` W;
    ``backend``: the train step's backend (``xp``, ``to_host``, ``to_device``); ``fused``: leave the
    buffer of a step with several ranks for the dense all-reduce (:meth:`take_pending`)."""

    def __init__(self, opt, row_params: int, row_width: int, backend, fused: bool = False):
        self.opt, self.row_params, self.row_width = opt, int(row_params), int(row_width)
        self.be, self.xp, self.fused = backend, backend.xp, bool(fused)
        self.keys = np.empty(0, np.uint64)
        self.rows = self.xp.empty((0, self.row_width), np.float32)
        self._pending: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.keys.shape[0])

    def pin(self, keys: np.ndarray, rows: np.ndarray | None) -> None:
        """Pin ``rows`` (h, row_width) float32 host of ``keys`` (h,) uint64 ascending (None for h = 0)."""
        self.keys = np.ascontiguousarray(keys, np.uint64)
        if self.size:
            self.rows = self.be.to_device(np.array(rows, np.float32), "fetch")  # its own copy

    # -- planning (host) --------------------------------------------------------------------------------
    def mask(self, keys: np.ndarray) -> np.ndarray:
        """(n,) bool: which of ``keys`` (n,) uint64 are hot."""
        return hot_mask(self.keys, keys)

    def slots(self, keys: np.ndarray) -> np.ndarray:
        """(n,) int64 positions of hot ``keys`` in ``self.keys``. REQUIRES every key hot."""
        return np.searchsorted(self.keys, keys).astype(np.int64)

    def divide(self, keys: np.ndarray, inv: np.ndarray):
        """Unique ``keys`` (u,) of a mini-batch and their ``inv`` (nnz,) -> (cold keys (c,), inv into
        ``[cold keys | hot keys]``, hot slots (u - c,) int64, or None without hot rows)."""
        if not self.size:
            return keys, inv, None
        hot = self.mask(keys)
        if not hot.any():
            return keys, inv, np.empty(0, np.int64)
        pos = np.empty(keys.shape[0], np.int64)
        n_cold = int((~hot).sum())
        pos[~hot] = np.arange(n_cold)
        pos[hot] = n_cold + np.arange(keys.shape[0] - n_cold)
        return keys[~hot], pos[inv], self.slots(keys[hot])

    # -- the step (train thread) ------------------------------------------------------------------------
    def with_params(self, params, slots):
        """``[params | hot rows' parameters]`` (u + k, P) xp, ``slots``: the mini-batch's staged hot
        slots (k,) (None or empty: ``params`` itself)."""
        if slots is None or not slots.shape[0]:
            return params
        return self.xp.concatenate([params, self.rows[slots, :self.row_params]])

    def step(self, slots: np.ndarray | None, staged, grads, ch) -> None:
        """The hot rows' gradients ``grads`` (k, P) xp of the mini-batch's hot ``slots`` (k,) host
        (``staged``: the same on the device): one optimizer step now (one rank), or the ranks' sum —
        one dense all-reduce of (h, P + 1) float32 over ``ch`` whose last column counts touches, or left
        for the dense all-reduce when ``fused`` — then one step on every row touched on some rank.
        Collective with several ranks (every rank, every mini-batch); nothing without hot rows."""
        if not self.size:
            return
        if ch.size == 1:  # nothing to sum: apply to this mini-batch's rows
            if slots is not None and slots.shape[0]:
                self.rows[staged] = self.opt.apply(self.rows[staged], grads)
            return
        P = self.row_params
        buf = np.zeros((self.size, P + 1), np.float32)
        if slots is not None and slots.shape[0]:
            buf[slots, :P] = self.be.to_host(grads)
            buf[slots, P] = 1.0
        if self.fused:
            self._pending = buf.ravel()
            return
        self.apply(ch.dense_allreduce(buf.ravel()))

    def take_pending(self) -> np.ndarray | None:
        """The (h * (P + 1),) float32 buffer a fused ``step`` left to be summed over the ranks, or None."""
        buf, self._pending = self._pending, None
        return buf

    def apply(self, summed: np.ndarray) -> None:
        """One optimizer step on every row touched on some rank, from ``summed`` (h * (P + 1),) float32
        host: every rank's gradients and touch counts of the hot rows, summed."""
        P = self.row_params
        buf = summed.reshape(self.size, P + 1)
        touched = np.flatnonzero(buf[:, P] > 0)
        if touched.shape[0]:
            at = self.be.to_device(touched)
            self.rows[at] = self.opt.apply(self.rows[at], self.be.to_device(np.ascontiguousarray(buf[touched, :P])))

    def params(self, slots: np.ndarray):
        """(k, P) xp: the parameters of the hot rows at ``slots`` (k,) host (held-out evaluation)."""
        return self.rows[self.be.to_device(slots, "plan"), :self.row_params]

    def current(self, keys: np.ndarray, params: np.ndarray):
        """``params`` (n, P) host, the parameters of ``keys`` (n,) read from the tiers, with those of the
        hot keys replaced by the pinned rows' (the tiers get them only at write-backs) -> (n, P) xp
        (``params`` itself, on the step's device, without hot keys)."""
        out = self.xp.asarray(params)
        hot = np.flatnonzero(self.mask(keys)) if self.size else np.empty(0, np.int64)
        if hot.shape[0]:
            out[self.be.to_device(hot, "plan")] = self.params(self.slots(keys[hot]))
        return out

    def write_back(self, memps, owned_mask) -> None:
        """Push the rows of the hot keys this rank owns into ``memps`` (dirty): checkpoints and the end
        of training, so the MEM-PS/SSD-PS hold every update."""
        mine = np.flatnonzero(owned_mask(self.keys))
        if mine.shape[0]:
            rows = self.be.to_host(self.rows[self.be.to_device(mine, "writeback")], "writeback")
            memps.push(self.keys[mine], rows, unpin=False)
