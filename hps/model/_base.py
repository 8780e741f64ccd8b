"""``FieldModel``: what every model shares — rows handed in by the caller, field pooling, the logit's
sigmoid and mean binary cross-entropy, dense parameters, checkpoints. Subclasses only say how the
pooled fields and dense features become a logit (:meth:`FieldModel._network`) and back.

One Python code path for NumPy (CPU) and CuPy (GPU): the array module ``xp`` is chosen at
construction. Only the pooling differs underneath (Numba kernels for NumPy, gather + scatter-add for
CuPy), see :func:`hps.model._layers.pool`.
"""

from __future__ import annotations

import threading

import numpy as np

from ..data._batch import Batch
from ..errors import InvalidInputError
from . import _layers as L
from ._chunks import CHUNK_ROWS, ChunkThreads, chunk_bounds
from ._config import ModelConfig
from ._flat import flat_of, flat_views
from ._graphs import PassGraphs

__all__ = ["FieldModel"]


class FieldModel:
    """Base of the models. The model does not own embeddings: the caller pulls the rows of a
    mini-batch's unique keys from its table, hands their first :attr:`row_params` columns to
    :meth:`forward_backward`, and applies a row optimizer to the returned gradient.

    A row's parameter part is ``[embedding (emb_dim) | first-order weight (1, only if
    first_order)]``; the optimizer state follows it in the row (the model never sees it).
    Dense parameters live in :attr:`params` (an ordered dict name -> array of ``xp`` and
    :attr:`dtype`), drawn in float64 from ``numpy.random.default_rng(seed)`` in the order of the dict
    (He-uniform for layers followed by a ReLU, Xavier-uniform otherwise, biases 0) and then cast.

    Not thread-safe: one trainer thread calls it; :meth:`predict` only reads the parameters. Host
    passes reuse scratch buffers between calls (``_layers.Scratch``) and may run on several threads
    (:meth:`set_threads`); returned arrays are always new.
    """

    name = ""
    #: True: rows carry a first-order (wide / linear) weight after the embedding
    first_order = False
    _arch: tuple[str, ...] = ()  # ModelConfig fields the subclass takes as keywords

    def __init__(self, n_fields: int, emb_dim: int, n_dense: int = 0, hidden=(256, 128), seed: int = 0,
                 xp=np, dtype=np.float32, **arch):
        self.cfg = ModelConfig(n_fields=n_fields, emb_dim=emb_dim, n_dense=n_dense, hidden=tuple(hidden),
                               seed=seed, dtype=np.dtype(dtype).name, model=self.name, **arch)
        self.n_fields, self.emb_dim, self.n_dense = self.cfg.n_fields, self.cfg.emb_dim, self.cfg.n_dense
        self.hidden, self.seed = self.cfg.hidden, self.cfg.seed
        self.xp = xp
        self.dtype = np.dtype(self.cfg.dtype)
        #: True: Numba kernels pool on the host (NumPy); False: gather + scatter-add (CuPy, tests)
        self.use_cpu_kernels = xp is np
        #: examples per chunk of a pass (``_chunks``): chunks on the host, the whole mini-batch on a GPU
        self.chunk_rows = CHUNK_ROWS if xp is np else None
        self._runner = ChunkThreads(1)
        self._scratch_bufs: list = []     # per chunk: the pooled pass keeps every chunk's ctx at once
        self._local = threading.local()   # per thread: a fused chunk needs its buffers only while it runs
        self._graphs = PassGraphs.for_model(self)  # on a GPU: the pooled pass as CUDA graphs (None: eagerly)
        parts = self._parts(self.cfg)
        rng = np.random.default_rng(seed)
        init = {}
        for attr, part in parts.items():
            setattr(self, attr, part)
            init.update(part.init(rng) if part is not None else {})
        #: the dense parameters, views of one flat buffer in this order (``_flat``: the optimizer steps it whole)
        self._dense_shapes = {k: v.shape for k, v in init.items()}
        self.params: dict = flat_views(xp, self._dense_shapes, self.dtype)
        for k, v in init.items():
            self.params[k][...] = xp.asarray(v.astype(self.dtype))

    @classmethod
    def from_config(cls, cfg: ModelConfig, xp=np) -> "FieldModel":
        if cfg.model != cls.name:
            raise InvalidInputError(f"config of model {cfg.model!r} given to {cls.__name__}")
        return cls(cfg.n_fields, cfg.emb_dim, cfg.n_dense, cfg.hidden, cfg.seed, xp=xp, dtype=cfg.dtype,
                   **{k: getattr(cfg, k) for k in cls._arch})

    @property
    def row_params(self) -> int:
        """Leading columns of a row that are parameters: ``emb_dim`` (+ 1 with a first-order weight)."""
        return self.emb_dim + int(self.first_order)

    @classmethod
    def dense_shapes(cls, cfg: ModelConfig) -> dict:
        """``{name: shape}`` of the dense parameters of the model ``cfg`` describes, without building
        it (nothing is allocated)."""
        parts = [p for p in cls._parts(cfg).values() if p is not None]
        return {k: v for part in parts for k, v in part.shapes().items()}

    def describe(self) -> str:
        """One line: fields, embeddings and the network."""
        name = "" if self.name == "ctr" else f"{self.name}: "
        return (f"{name}{self.n_fields} fields x {self.emb_dim}-dim embeddings (sum-pooled) + {self.n_dense} "
                f"dense -> {self._describe()} -> sigmoid")

    # -- what a subclass defines -----------------------------------------------------------------
    @classmethod
    def _parts(cls, cfg: ModelConfig) -> dict:
        """The model's layers, ``{attribute: layer or None}``, each with ``init(rng)`` and ``shapes()``;
        their parameters are drawn in this order. Allocates nothing."""
        raise NotImplementedError

    def _describe(self) -> str:
        """The network, for :meth:`describe`."""
        raise NotImplementedError

    def _network(self, pooled, dense, ws=None):
        """pooled (n, F * row_params), dense (n, n_dense) or None -> (logits (n,), ctx); activations
        into the :class:`~hps.model._layers.Scratch` ``ws`` when given (None: new arrays)."""
        raise NotImplementedError

    def _network_backward(self, ctx, dz, grads, ws=None):
        """dz (n, 1) -> d pooled (n, F * row_params) (may be a ``ws`` buffer: the caller copies it);
        dense gradients (new arrays) added into ``grads``."""
        raise NotImplementedError

    # -- shared helpers for subclasses ------------------------------------------------------------
    def _split(self, pooled):
        """pooled (n, F * (d + 1)) -> (embeddings (n, F, d), first-order logit (n,))."""
        p3 = pooled.reshape(pooled.shape[0], self.n_fields, self.row_params)
        return p3[:, :, :self.emb_dim], p3[:, :, self.emb_dim].sum(axis=1)

    def _join(self, d_emb, dz, ws=None):
        """Inverse of :meth:`_split` for gradients: d_emb (n, F, d), dz (n, 1) -> (n, F * (d + 1))."""
        n = d_emb.shape[0]
        out = L.buffer(self.xp, ws, "d_pooled", (n, self.n_fields, self.row_params), self.dtype)
        out[:, :, :self.emb_dim] = d_emb
        out[:, :, self.emb_dim] = dz
        return out.reshape(n, self.n_fields * self.row_params)

    def _deep_input(self, emb, dense, ws=None):
        """MLP input ``[embeddings flattened | dense]`` (n, F * d + n_dense) from emb (n, F, d): without
        dense features a view of ``emb`` if it is contiguous (a new copy otherwise), else one copy into
        ``ws``."""
        n, F, d = emb.shape[0], self.n_fields, self.emb_dim
        if dense is None:
            return emb.reshape(n, F * d)
        x = L.buffer(self.xp, ws, "x0", (n, F * d + dense.shape[1]), self.dtype)
        x[:, :F * d].reshape(n, F, d)[...] = emb  # a view: splits the contiguous last axis
        x[:, F * d:] = dense
        return x

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Host (NumPy) copies of the dense parameters, by name."""
        return {k: _to_host(v).copy() for k, v in self.params.items()}

    def load_state_dict(self, state: dict) -> None:
        """Set the dense parameters to ``state``'s values, in place (the arrays stay views of one buffer,
        and whoever holds them sees the values); names and shapes must match exactly."""
        if set(state) != set(self.params):
            raise InvalidInputError(f"state names {sorted(state)} != model names {sorted(self.params)}")
        for k, v in state.items():
            if tuple(v.shape) != tuple(self.params[k].shape):
                raise InvalidInputError(f"{k}: shape {tuple(v.shape)} != {tuple(self.params[k].shape)}")
        for k, v in state.items():
            self.params[k][...] = self.xp.asarray(np.asarray(_to_host(v), dtype=self.dtype))

    # -- threads ---------------------------------------------------------------------------------
    @property
    def threads(self) -> int:
        """Threads a host pass runs on (:meth:`set_threads`)."""
        return self._runner.threads

    @property
    def helper_cpu_seconds(self) -> float:
        """CPU seconds the helper threads of host passes have used so far (``_chunks``)."""
        return self._runner.helper_cpu_seconds

    def set_threads(self, threads: int) -> None:
        """Run host passes on ``threads`` threads: the caller and ``threads - 1`` helpers that sleep
        between calls (``_chunks``). Results are the same for every thread count. ``set_threads(1)``
        (the default) stops the helpers. Call it from the thread that trains."""
        self._runner.resize(threads)

    # -- compute -----------------------------------------------------------------------------------
    def predict(self, rows, inv, batch: Batch):
        """Click probabilities (n,) of ``batch``. Arguments as in :meth:`forward_backward`. Blocking;
        allocates its arrays (no scratch buffer), so it may run beside a training step."""
        xp = self.xp
        keys, dense = self._inputs(rows, inv, batch)
        n = len(batch)
        bounds = chunk_bounds(n, self.chunk_rows)
        z = xp.empty(n, dtype=self.dtype)

        def forward(i):
            r0, r1 = bounds[i]
            z[r0:r1] = self._network(self._pool(keys, n, r0, r1, None), _rows(dense, r0, r1))[0]

        self._runner.run(forward, len(bounds))
        return _sigmoid(xp, z)

    def forward_backward(self, rows, inv, batch: Batch, n_total: int | None = None):
        """Loss and gradients of one mini-batch (or of this rank's share of a global mini-batch).

        rows (u, row_params) float, xp: the parameter part of the rows of the mini-batch's unique keys.
        inv (nnz,) int, xp or host: unique row of each key occurrence (any order of the unique keys,
            e.g. ``np.unique(return_inverse=True)`` or first-occurrence order as the trainer uses).
        batch: host :class:`Batch` with ``n`` examples and ``nnz`` keys.
        n_total: examples of the GLOBAL mini-batch; default ``n``. Loss and gradients are those of
            ``sum(bce over this batch) / n_total``, so shares of a global mini-batch (each called with
            the same ``n_total``) have gradients and losses that SUM to the single-process ones.

        Returns ``(loss, probs, grad_rows, dense_grads)``: loss a Python float (this share's term of
        the global mean), probs (n,) xp, grad_rows (u, row_params) xp — the gradient w.r.t. each unique
        row, summed over all its occurrences — and dense_grads a dict with the keys and shapes of
        :attr:`params`. Every returned array is new (none is a scratch buffer). Blocks until the loss
        is on the host.

        On the host the examples go through pooling, network and loss chunk by chunk (``_chunks``),
        on :attr:`threads` threads; the chunks' dense gradients are summed in chunk order.
        """
        xp = self.xp
        n = len(batch)
        denom = n if n_total is None else int(n_total)
        if n_total is not None and (denom <= 0 or denom < n):
            raise InvalidInputError(f"n_total must be >= the {n} local examples and > 0, got {n_total}")
        keys, dense = self._inputs(rows, inv, batch)
        rows = keys[0]
        y = xp.asarray(batch.labels).astype(self.dtype, copy=False)
        if n == 0:
            grads = {k: xp.zeros_like(v) for k, v in self.params.items()}
            return 0.0, xp.zeros(0, dtype=self.dtype), xp.zeros_like(rows), grads
        bounds = chunk_bounds(n, self.chunk_rows)
        z, probs = xp.empty(n, dtype=self.dtype), xp.empty(n, dtype=self.dtype)
        d_pooled = xp.empty((n, self.n_fields * self.row_params), dtype=self.dtype)
        scale = self.dtype.type(denom)

        def step(i):
            r0, r1 = bounds[i]
            ws = self._thread_scratch()
            z_c, ctx = self._network(self._pool(keys, n, r0, r1, ws), _rows(dense, r0, r1), ws)
            p_c = _sigmoid(xp, z_c)
            z[r0:r1], probs[r0:r1] = z_c, p_c
            p_c -= y[r0:r1]
            p_c /= scale                                              # d loss / d z
            grads = self._grad_targets() if i == 0 else {}
            d_pooled[r0:r1] = self._network_backward(ctx, p_c[:, None], grads, ws)
            return grads

        grads = self._sum_grads(self._runner.run(step, len(bounds)))
        # bce(z, y) = softplus(z) - y z = max(z, 0) - y z + log1p(exp(-|z|))
        loss = float((xp.maximum(z, 0) - y * z + xp.log1p(xp.exp(-xp.abs(z)))).sum()) / denom
        inv, f, w, off = keys[1:]
        grad_rows = L.pool_backward(xp, d_pooled, rows.shape[0], inv, f, w, off, self.n_fields,
                                    self.use_cpu_kernels)
        return loss, probs, grad_rows, grads

    def cuda_graphs(self) -> dict | None:
        """What the pooled pass did as CUDA graphs (``_graphs.PassGraphs.stats``), None where none are made."""
        return None if self._graphs is None else self._graphs.stats()

    def forward_backward_pooled(self, pooled, dense, loss_grad):
        """The network's forward and backward on pooled input already on the device, without
        synchronising (GPU-resident training pools straight from the HBM-PS and keeps the loss there).

        pooled (n, F * row_params) xp of :attr:`dtype`, C-contiguous: the weighted sum-pooled rows
            per (example, field), as :meth:`forward_backward` pools them.
        dense (n, n_dense) xp of :attr:`dtype`, or None without dense features.
        loss_grad(z) -> dz: given the logits z (n,) xp, returns d loss / d z (n,) xp of :attr:`dtype`
            and accounts for the loss itself (e.g. ``hps.gpu.bce_loss_grad_async`` adding it to a
            device accumulator), so no host value is read here.

        Returns ``(grad_pooled (n, F * row_params) xp, C-contiguous, dense_grads dict)``, the dict
        with the keys and shapes of :attr:`params`. Asynchronous on a GPU (nothing reads back). On the
        host both are new arrays; the chunks' forwards run first, then ``loss_grad`` once, then their
        backwards (:meth:`forward_backward` interleaves them, which keeps each chunk in cache). On a
        GPU with ``HPS_CUDA_GRAPHS=1`` the pass of a shape seen before replays as two CUDA graphs
        (``_graphs``; the products through cuBLAS, ``HPS_CUDA_GEMM``), and both are
        that graph's arrays: the same every call of that shape, valid until its next call.
        """
        if self._graphs is not None:
            out = self._graphs.run(pooled, dense, loss_grad)
            if out is not None:
                return out
        scratch = self._scratch(len(chunk_bounds(pooled.shape[0], self.chunk_rows)))
        z, ctxs = self._pooled_forward(pooled, dense, scratch)
        return self._pooled_backward(ctxs, loss_grad(self.xp.ascontiguousarray(z))[:, None], scratch)

    def _pooled_forward(self, pooled, dense, scratch):
        """:meth:`forward_backward_pooled`'s forward: (logits z (n,), every chunk's ctx), the chunks'
        activations in ``scratch`` (one :class:`~hps.model._layers.Scratch` per chunk)."""
        n = pooled.shape[0]
        bounds = chunk_bounds(n, self.chunk_rows)
        z = self.xp.empty(n, dtype=self.dtype)

        def forward(i):
            r0, r1 = bounds[i]
            z_c, ctx = self._network(pooled[r0:r1], _rows(dense, r0, r1), scratch[i])
            z[r0:r1] = z_c
            return ctx

        return z, self._runner.run(forward, len(bounds))

    def _pooled_backward(self, ctxs, dz, scratch):
        """:meth:`forward_backward_pooled`'s backward from ``dz`` (n, 1) -> (grad_pooled, dense_grads)."""
        n = dz.shape[0]
        bounds = chunk_bounds(n, self.chunk_rows)
        d_pooled = self.xp.empty((n, self.n_fields * self.row_params), dtype=self.dtype)

        def backward(i):
            r0, r1 = bounds[i]
            grads = self._grad_targets() if i == 0 else {}
            d_pooled[r0:r1] = self._network_backward(ctxs[i], dz[r0:r1], grads, scratch[i])
            return grads

        return d_pooled, self._sum_grads(self._runner.run(backward, len(bounds)))

    def _grad_targets(self) -> dict:
        """Where the first chunk of a pass writes its dense gradients: ``{name: view}`` of a new flat buffer
        laid out as :attr:`params` (``_flat``), so the pass's gradients reach the optimizer as one buffer."""
        return flat_views(self.xp, self._dense_shapes, self.dtype)

    def _sum_grads(self, per_chunk: list) -> dict:
        """The chunks' dense gradients summed in chunk order, into the first chunk's (new) arrays."""
        out = per_chunk[0]
        for g in per_chunk[1:]:
            for k in out:
                out[k] += g[k]
        if flat_of(out) is not None and list(out) == list(self.params):  # the pass's flat buffer (_grad_targets)
            return out
        return {k: out[k] for k in self.params}

    def _thread_scratch(self):
        """The calling thread's :class:`~hps.model._layers.Scratch` (for a chunk that runs its forward
        and backward back to back: threads x one chunk's activations, not the whole pass's)."""
        ws = getattr(self._local, "ws", None)
        if ws is None:
            ws = self._local.ws = L.Scratch(self.xp)
        return ws

    def _scratch(self, k: int) -> list:
        """One :class:`~hps.model._layers.Scratch` per chunk, made before the chunks run."""
        while len(self._scratch_bufs) < k:
            self._scratch_bufs.append(L.Scratch(self.xp))
        return self._scratch_bufs[:k]

    def _pool(self, keys, n: int, r0: int, r1: int, ws):
        """Pooled rows (r1 - r0, F * row_params) of examples ``r0:r1`` (into ``ws`` when given)."""
        rows, inv, f, w, off = keys
        if (r0, r1) != (0, n) and self.use_cpu_kernels:  # the kernel reads offsets as absolute positions
            off = off[r0:r1 + 1]
        elif (r0, r1) != (0, n):  # a chunk's own key occurrences, offsets from 0
            k0, k1 = int(off[r0]), int(off[r1])
            inv, f, w, off = inv[k0:k1], f[k0:k1], w[k0:k1], off[r0:r1 + 1] - k0
        out = None if ws is None else ws.get("pooled", (r1 - r0, self.n_fields * self.row_params), self.dtype)
        return L.pool(self.xp, rows, inv, f, w, off, r1 - r0, self.n_fields, self.use_cpu_kernels, out=out)

    def _inputs(self, rows, inv, batch: Batch):
        """Validate and move to xp -> (``(rows, inv, f, w, off)``, dense (n, n_dense) or None)."""
        xp, P = self.xp, self.row_params
        if batch.n_fields != self.n_fields:
            raise InvalidInputError(f"batch has {batch.n_fields} fields, model {self.n_fields}")
        n, nnz = len(batch), int(batch.offsets[-1]) if len(batch.offsets) else 0
        rows = xp.asarray(rows)
        if rows.dtype != self.dtype:
            rows = rows.astype(self.dtype)
        rows = xp.ascontiguousarray(rows)
        if rows.ndim != 2 or rows.shape[1] != P:
            raise InvalidInputError(f"{self.name} rows must be (u, {P}) (row_params), got {tuple(rows.shape)}")
        if inv.shape != (nnz,) or batch.keys.shape[0] != nnz:
            raise InvalidInputError(f"inv must be ({nnz},) like batch.keys, got {tuple(inv.shape)}")
        if batch.dense.shape != (n, self.n_dense):
            raise InvalidInputError(f"batch.dense must be ({n}, {self.n_dense}), got {batch.dense.shape}")
        f = batch.field
        if nnz:
            if int(inv.min()) < 0 or int(inv.max()) >= rows.shape[0]:
                raise InvalidInputError(f"inv must index the {rows.shape[0]} unique rows")
            if int(f.min()) < 0 or int(f.max()) >= self.n_fields:
                raise InvalidInputError(f"batch.field must be in [0, {self.n_fields})")
        inv = xp.ascontiguousarray(xp.asarray(inv, dtype=np.int64))
        f = xp.ascontiguousarray(xp.asarray(f, dtype=np.int32))
        w = xp.ascontiguousarray(xp.asarray(batch.weights, dtype=self.dtype))
        off = xp.ascontiguousarray(xp.asarray(batch.offsets, dtype=np.int64))
        dense = xp.asarray(batch.dense).astype(self.dtype, copy=False) if self.n_dense else None
        return (rows, inv, f, w, off), dense


def _rows(a, r0: int, r1: int):
    """Rows ``r0:r1`` of ``a``, or None."""
    return None if a is None else a[r0:r1]


def _sigmoid(xp, z):
    """Overflow-free sigmoid."""
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1 / (1 + e), e / (1 + e)).astype(z.dtype, copy=False)


def _to_host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)
