"""``--dense-sync easgd``: Hierarchical Training's groups with background EASGD between them (Huang et
al., KDD 2021, §3.1; Zhang et al., EASGD), a dense sync strategy (``_dense_sync``; ``allreduce``, the
default, is one dense copy stepped in BSP there).

``easgd`` with ``--groups G``: the ranks form G contiguous groups of N/G (rank r is in group
``r // (N / G)``); each group holds one dense copy. Per mini-batch the dense gradients are summed over
the group only (its own communicator, split from the job's) and scaled to the mean over the group's
examples, so the ranks of a group stay identical (§3.1.1's group copy; synchronous inside the group
rather than Hogwild). Every ``--easgd-every T`` mini-batches the training thread hands a snapshot
``x`` of its copy to a background thread and goes on; that thread runs one EASGD round against the
centre copy ``c`` on a communicator of its own (ShadowSync)::

    d = alpha (x - c);   c += sum over groups of d;   x -= d   (elastic averaging)

**Where the centre lives:** sharded over the group leaders (the first rank of each group): leader
``g`` owns the ``g``-th of G equal slices of the flattened parameters (padded to a multiple of G).
A round is one allgatherv (the leaders' slices -> every rank has ``c``; each rank computes the same
``d`` as the rest of its group) and one alltoallv (each leader sends slice ``s`` of its group's ``d``
to leader ``s``, which adds the G slices in float32, in rank order). No rank holds more than 1/G of
the centre, and no rank is a dedicated parameter server.

**Deterministic, not blocking:** a round's ``d`` is subtracted from the copy at the next round, T
mini-batches later (staleness T), when the training thread collects the result. It waits only if a
round takes longer than T mini-batches of training (``easgd_wait_seconds`` in the metrics says how
long it waited). The result does not depend on thread timing, so a resumed run continues exactly.

With G = 1 there is one copy and nothing to average: no round runs and the job is the
``allreduce`` job exactly. With G = N every rank is a group: plain EASGD per rank. At the end of
training every rank takes the centre copy (EASGD's result), which is what is evaluated and exported.
``--compress bf16``/``int8`` send the group all-reduce and the rounds as bfloat16
(``hps.comm._compress``); centre and copies stay float32.

Checkpoints: every rank writes into its own checkpoint file (group ``easgd``) its group's copy,
optimizer state and pending ``d``, the mini-batch counter and, on a leader, its slice of the centre
(``checkpoint_writer`` / ``read_checkpoint`` / ``restore``).

Thread safety: the train thread calls every method; the background thread only runs ``_round``
(on its own channel, the centre slice and the snapshot it was given).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ..comm import DENSE_EASGD, Compression
from ..comm._compress import from_bf16, to_bf16
from ..errors import InvalidInputError
from ._dense_sync import CKPT_GROUP, DenseSync, check_groups


def default_alpha(groups: int) -> float:
    """EASGD's moving rate when ``--easgd-alpha`` is unset: beta / G with beta = 0.9 (Zhang et al.)."""
    return 0.9 / groups


class EasgdSync(DenseSync):
    """``--dense-sync easgd`` with G > 1 groups (see the module docstring). ``coll``, ``params``,
    ``dense_opt``, ``backend``, ``compress``: as :class:`~hps.train._dense_sync.DenseSync`; ``groups``
    G, ``alpha`` (None: :func:`default_alpha`), ``every`` T: the flags. Construction is collective over
    ``coll.main`` (it splits the group communicators). Raises InvalidInputError when G does not
    divide the ranks (one process included: it never falls back to one dense copy)."""

    def __init__(self, coll, params: dict, dense_opt, backend, compress: Compression | None = None, *,
                 groups: int, alpha=None, every: int = 1):
        size, rank = coll.size, coll.rank
        if size == 1:
            raise InvalidInputError(f"--groups {groups} needs {groups} or more MPI ranks (a dense copy per group); "
                                    "one process trains one dense copy, and --data-shards does not form groups: "
                                    f"run under mpiexec -n N with N a multiple of {groups}, or drop --groups")
        if groups > size or size % groups:
            raise InvalidInputError(f"--groups {groups} must divide the number of ranks ({size}) into groups of "
                                    "equal size")
        super().__init__(coll, params, dense_opt, backend, compress, mode="easgd")
        self.G, self.every = int(groups), int(every)
        self.alpha = float(alpha) if alpha is not None else default_alpha(self.G)
        per = size // self.G
        self.group, self.leader = rank // per, rank % per == 0
        self.leaders = np.arange(0, size, per)
        self.shapes = [(k, tuple(p.shape)) for k, p in params.items()]
        self.n = sum(int(np.prod(s, dtype=np.int64)) for _, s in self.shapes)
        self.m = -(-self.n // self.G)               # centre slice per leader
        self.steps = 0                              # dense steps taken (every rank the same)
        self.rounds = 0
        self.wait_seconds = 0.0
        self._pending = None                        # Future or ndarray: the last round's d
        self._restored = None                       # read_checkpoint's state, until restore applies it
        base = coll.main.comm
        self.group_ch = coll.channel("group", base.Split(self.group, rank), thread="train")  # the train thread's
        self.bg_ch = coll.channel("easgd", base.Dup())                                      # the rounds' thread
        flat = self._flatten()
        self.centre = flat[self.group * self.m:(self.group + 1) * self.m].copy() if self.leader else None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"hps-easgd-r{rank}")

    # -- the train thread's hooks ---------------------------------------------------------------------
    def _allreduce(self, flat: np.ndarray, n_local: int, n_total: int):
        """The dense gradients ``flat`` (n,) float32 of this rank's ``n_local`` examples of a global
        mini-batch of ``n_total`` -> the mean over the group's examples, or None when its group had no
        example (no step). Collective over the group."""
        n_group = int(self.group_ch.allsum_array(np.array([n_local], np.int64))[0])
        if n_group == 0:
            return None
        flat = self.compress.allreduce_dense(self.group_ch, flat)
        flat *= np.float32(n_total / n_group)  # grads were divided by n_total: the mean over the group
        return flat

    def after_step(self) -> None:
        """After every global mini-batch (stepped or not): every T of them, apply the last round's
        ``d`` and start the next round in the background."""
        self.steps += 1
        if self.steps % self.every:
            return
        if self._pending is not None:
            self._apply(self._result())
        self._pending = self._pool.submit(self._round, self._flatten())

    def finish(self) -> None:
        """End of training: wait for the last round and give every rank the centre copy (EASGD's
        result). Collective."""
        if self._pending is not None:
            self._result()
        self._set(self._centre(compressed=False))

    def save(self, w, ckpt) -> None:
        """Add to ``ckpt`` this rank's EASGD state, written into its own checkpoint file: the group
        copy, its optimizer state, the pending d, the round counter and, on a leader, its slice of the
        centre. Waits for a round in flight (its d stays pending). Train thread."""
        ckpt.writers.append(self.checkpoint_writer())

    def checkpoint_writer(self):
        """``write(h5file)`` of :meth:`save`."""
        pending = self._result() if self._pending is not None else None
        flat, st = self._flatten()[:self.n], self.dense_opt.state_dict()
        centre = None if self.centre is None else self.centre.copy()
        steps = self.steps

        def write(h):
            g = h.create_group(CKPT_GROUP)
            g.attrs["groups"], g.attrs["steps"], g.attrs["opt_step"] = self.G, steps, st["step"]
            g.create_dataset("params", data=flat)
            if pending is not None:
                g.create_dataset("pending", data=pending)
            if centre is not None:
                g.create_dataset("centre", data=centre)
            for slot, arrays in st.items():
                if isinstance(arrays, dict):
                    for name, a in arrays.items():
                        g.create_dataset(f"opt/{slot}/{name}", data=a)

        return write

    def read_checkpoint(self, h) -> None:
        """Read what :meth:`checkpoint_writer` wrote into this rank's checkpoint file ``h``;
        :meth:`restore` applies it. Raises InvalidInputError when the checkpoint was written with
        another number of groups."""
        g = h.get(CKPT_GROUP)
        check_groups(g, self.G)
        self._restored = {"steps": int(g.attrs["steps"]), "opt_step": int(g.attrs["opt_step"]),
                          "params": g["params"][()], "pending": g["pending"][()] if "pending" in g else None,
                          "centre": g["centre"][()] if "centre" in g else None,
                          "opt": {slot: {name: g[f"opt/{slot}/{name}"][()] for name in g[f"opt/{slot}"]}
                                  for slot in (g["opt"] if "opt" in g else ())}}

    def restore(self, meta: dict | None = None) -> None:
        """After ``_checkpoint.load`` (which set rank 0's dense state): this rank's group copy,
        optimizer state, pending d, counter and centre slice as :meth:`read_checkpoint` read them."""
        r = self._restored
        if r is None:
            return
        self._set(r["params"])
        st = self.dense_opt.state_dict()
        st["step"] = r["opt_step"]
        st.update(r["opt"])
        self.dense_opt.load_state_dict(st)
        self.steps, self._pending = r["steps"], r["pending"]
        if self.leader:
            self.centre = np.array(r["centre"], np.float32)
        self._restored = None

    def metrics(self, per_rank: list) -> dict:
        return dict(super().metrics(per_rank), easgd_alpha=self.alpha, easgd_rounds=self.rounds,
                    easgd_wait_seconds=self.wait_seconds)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # -- the round (background thread) ----------------------------------------------------------------
    def _round(self, x: np.ndarray) -> np.ndarray:
        """One EASGD round on the snapshot ``x`` (n_pad,) float32 -> this group's d (n_pad,)."""
        c = self._centre(compressed=True)
        d = np.float32(self.alpha) * (x - c)
        size, G, m = self.coll.size, self.G, self.m
        send = np.zeros(size, np.int64)
        recv = np.zeros(size, np.int64)
        if self.leader:
            send[self.leaders] = 1
            recv[self.leaders] = 1
        rows = d.reshape(G, m) if self.leader else np.empty((0, m), np.float32)
        got = self.compress.exchange_grads(self.bg_ch, rows, send, recv, DENSE_EASGD)
        if self.leader:  # G slices of d for my part of the centre, added in rank order, in float32
            for k in range(G):
                self.centre += got[k]
        return d

    def _centre(self, compressed: bool) -> np.ndarray:
        """The whole centre (n_pad,) float32 on every rank (one allgatherv over the background
        channel; bf16 when ``compressed`` and the mode compresses)."""
        mine = self.centre.reshape(1, -1) if self.leader else np.empty((0, self.m), np.float32)
        if compressed and self.compress.dense != "none":
            return from_bf16(self.bg_ch.allgatherv(to_bf16(mine), DENSE_EASGD)).reshape(-1)
        return self.bg_ch.allgatherv(np.ascontiguousarray(mine), DENSE_EASGD).reshape(-1)

    # -- helpers --------------------------------------------------------------------------------------
    def _result(self) -> np.ndarray:
        """The pending round's d (waiting for it if it is still running)."""
        p = self._pending
        if isinstance(p, Future):
            t0 = time.perf_counter()
            p = p.result()
            self.wait_seconds += time.perf_counter() - t0
            self.rounds += 1
            self._pending = p
        return p

    def _flatten(self) -> np.ndarray:
        """The dense parameters (n_pad,) float32 host (``mpi`` bytes on a GPU)."""
        out = np.zeros(self.m * self.G, np.float32)
        off = 0
        for k, shape in self.shapes:
            a = self.be.to_host(self.params[k]).ravel()
            out[off:off + a.size] = a
            off += a.size
        return out

    def _apply(self, d: np.ndarray) -> None:
        """x -= d, in place, for every dense parameter."""
        self._pending = None
        off = 0
        for k, shape in self.shapes:
            size = int(np.prod(shape, dtype=np.int64))
            p = self.params[k]
            p -= self.be.to_device(d[off:off + size].reshape(shape).astype(p.dtype, copy=False))
            off += size

    def _set(self, flat: np.ndarray) -> None:
        off = 0
        for k, shape in self.shapes:
            size = int(np.prod(shape, dtype=np.int64))
            p = self.params[k]
            p[...] = self.be.to_device(flat[off:off + size].reshape(shape).astype(p.dtype, copy=False))
            off += size


def make_dense_sync(mode: str, coll, params: dict, dense_opt, backend, *, compress: str = "none",
                    groups: int = 1, alpha=None, every: int = 1) -> DenseSync:
    """The dense sync strategy of ``--dense-sync mode`` (``--groups``, ``--easgd-alpha``,
    ``--easgd-every``, ``--compress``). Collective over ``coll.main``."""
    codec = Compression(compress)
    if mode == "allreduce" or groups == 1:  # one dense copy: the allreduce job exactly
        return DenseSync(coll, params, dense_opt, backend, codec, mode=mode)
    return EasgdSync(coll, params, dense_opt, backend, codec, groups=groups, alpha=alpha, every=every)
