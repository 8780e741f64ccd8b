"""``FieldModel``: what every model shares — rows handed in by the caller, field pooling, the logit's
sigmoid and mean binary cross-entropy, dense parameters, checkpoints. Subclasses only say how the
pooled fields and dense features become a logit (:meth:`FieldModel._network`) and back.

One Python code path for NumPy (CPU) and CuPy (GPU): the array module ``xp`` is chosen at
construction. Only the pooling differs underneath (Numba kernels for NumPy, gather + scatter-add for
CuPy), see :func:`hps.model._layers.pool`.
"""

from __future__ import annotations

import numpy as np

from ..data._batch import Batch
from ..errors import InvalidInputError
from . import _layers as L
from ._config import ModelConfig

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

    Not thread-safe: one trainer thread calls it; :meth:`predict` only reads the parameters.
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
        self.params: dict = {}
        parts = self._parts(self.cfg)
        rng = np.random.default_rng(seed)
        for attr, part in parts.items():
            setattr(self, attr, part)
            for k, v in (part.init(rng) if part is not None else {}).items():
                self.params[k] = xp.asarray(v.astype(self.dtype))

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

    def _network(self, pooled, dense):
        """pooled (n, F * row_params), dense (n, n_dense) or None -> (logits (n,), ctx)."""
        raise NotImplementedError

    def _network_backward(self, ctx, dz, grads):
        """dz (n, 1) -> d pooled (n, F * row_params); dense gradients added into ``grads``."""
        raise NotImplementedError

    # -- shared helpers for subclasses ------------------------------------------------------------
    def _split(self, pooled):
        """pooled (n, F * (d + 1)) -> (embeddings (n, F, d), first-order logit (n,))."""
        p3 = pooled.reshape(pooled.shape[0], self.n_fields, self.row_params)
        return p3[:, :, :self.emb_dim], p3[:, :, self.emb_dim].sum(axis=1)

    def _join(self, d_emb, dz):
        """Inverse of :meth:`_split` for gradients: d_emb (n, F, d), dz (n, 1) -> (n, F * (d + 1))."""
        n = d_emb.shape[0]
        out = self.xp.empty((n, self.n_fields, self.row_params), dtype=self.dtype)
        out[:, :, :self.emb_dim] = d_emb
        out[:, :, self.emb_dim] = dz
        return out.reshape(n, self.n_fields * self.row_params)

    def _deep_input(self, emb, dense):
        """MLP input ``[embeddings flattened | dense]`` (n, F * d + n_dense) from emb (n, F, d)."""
        x = emb.reshape(emb.shape[0], self.n_fields * self.emb_dim)
        return self.xp.concatenate([x, dense], axis=1) if dense is not None else x

    # -- checkpoints -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Host (NumPy) copies of the dense parameters, by name."""
        return {k: _to_host(v).copy() for k, v in self.params.items()}

    def load_state_dict(self, state: dict) -> None:
        """Replace the dense parameters; names and shapes must match exactly."""
        if set(state) != set(self.params):
            raise InvalidInputError(f"state names {sorted(state)} != model names {sorted(self.params)}")
        for k, v in state.items():
            if tuple(v.shape) != tuple(self.params[k].shape):
                raise InvalidInputError(f"{k}: shape {tuple(v.shape)} != {tuple(self.params[k].shape)}")
        for k, v in state.items():
            self.params[k] = self.xp.asarray(np.asarray(_to_host(v), dtype=self.dtype))

    # -- compute -----------------------------------------------------------------------------------
    def predict(self, rows, inv, batch: Batch):
        """Click probabilities (n,) of ``batch``. Arguments as in :meth:`forward_backward`. Blocking."""
        pooled, dense, _ = self._inputs(rows, inv, batch)
        z, _ = self._network(pooled, dense)
        return _sigmoid(self.xp, z)

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
        :attr:`params`. Blocks until the loss is on the host.
        """
        xp = self.xp
        n = len(batch)
        denom = n if n_total is None else int(n_total)
        if n_total is not None and (denom <= 0 or denom < n):
            raise InvalidInputError(f"n_total must be >= the {n} local examples and > 0, got {n_total}")
        pooled, dense, (rows, inv, f, w, off) = self._inputs(rows, inv, batch)
        z, ctx = self._network(pooled, dense)
        y = xp.asarray(batch.labels).astype(self.dtype, copy=False)
        if n == 0:
            grads = {k: xp.zeros_like(v) for k, v in self.params.items()}
            return 0.0, z, xp.zeros_like(rows), grads
        # bce(z, y) = softplus(z) - y z = max(z, 0) - y z + log1p(exp(-|z|))
        loss = float((xp.maximum(z, 0) - y * z + xp.log1p(xp.exp(-xp.abs(z)))).sum()) / denom
        probs = _sigmoid(xp, z)
        dz = ((probs - y) / self.dtype.type(denom))[:, None]           # d loss / d z, (n, 1)
        grads: dict = {}
        d_pooled = self._network_backward(ctx, dz, grads)
        grads = {k: grads[k] for k in self.params}
        grad_rows = L.pool_backward(xp, xp.ascontiguousarray(d_pooled), rows.shape[0], inv, f, w, off,
                                    self.n_fields, self.use_cpu_kernels)
        return loss, probs, grad_rows, grads

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
        with the keys and shapes of :attr:`params`. Asynchronous on a GPU (nothing reads back).
        """
        z, ctx = self._network(pooled, dense)
        dz = loss_grad(self.xp.ascontiguousarray(z))[:, None]
        grads: dict = {}
        d_pooled = self._network_backward(ctx, dz, grads)
        return self.xp.ascontiguousarray(d_pooled), {k: grads[k] for k in self.params}

    def _inputs(self, rows, inv, batch: Batch):
        """Validate, move to xp, pool -> (pooled (n, F * row_params), dense (n, n_dense) or None,
        the moved arrays)."""
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
        pooled = L.pool(xp, rows, inv, f, w, off, n, self.n_fields, self.use_cpu_kernels)
        dense = xp.asarray(batch.dense).astype(self.dtype, copy=False) if self.n_dense else None
        return pooled, dense, (rows, inv, f, w, off)


def _sigmoid(xp, z):
    """Overflow-free sigmoid."""
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1 / (1 + e), e / (1 + e)).astype(z.dtype, copy=False)


def _to_host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)
