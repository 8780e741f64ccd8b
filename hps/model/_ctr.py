"""The CTR network: field embeddings (weighted sum-pooled), concatenated with dense features, an MLP
with ReLU, one logit, sigmoid, mean binary cross-entropy.

One Python code path for NumPy (CPU) and CuPy (GPU): the array module ``xp`` is chosen at
construction. Only the pooling step differs underneath: Numba kernels (``_kernels.py``) for NumPy, a
gather + ``cupyx.scatter_add`` for CuPy (or any other ``xp`` that offers a scatter-add).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data._batch import Batch
from ..errors import InvalidInputError
from . import _kernels

__all__ = ["ModelConfig", "CTRModel"]


@dataclass(frozen=True)
class ModelConfig:
    """Shape, initialisation and optimizers of the CTR model. Validated on construction."""

    n_fields: int                               #: number of categorical fields F (> 0)
    emb_dim: int = 16                           #: embedding width d (> 0)
    n_dense: int = 0                            #: dense (numerical) features per example (>= 0)
    hidden: tuple[int, ...] = (256, 128)        #: MLP hidden widths, each > 0; () = logistic regression
    seed: int = 0                               #: seeds dense init and key-seeded embedding init
    emb_init_scale: float = 0.01                #: embeddings start U(-scale, scale), see ``init_embeddings``
    sparse_optimizer: str = "adagrad"           #: "adagrad" (default) or "sgd", see ``make_sparse_optimizer``
    sparse_lr: float = 0.05                     #: learning rate of the sparse (embedding) optimizer
    adagrad_initial_accumulator: float = 0.0    #: Adagrad accumulator of a new row (torch's default)
    adagrad_eps: float = 1e-10                  #: Adagrad denominator epsilon (torch's default)
    dense_optimizer: str = "adam"               #: "adam" (default) or "sgd", see ``make_dense_optimizer``
    dense_lr: float = 1e-3                      #: learning rate of the dense (MLP) optimizer
    adam_betas: tuple[float, float] = (0.9, 0.999)  #: Adam (beta1, beta2)
    adam_eps: float = 1e-8                      #: Adam denominator epsilon
    dtype: str = "float32"                      #: parameter dtype, "float32" or "float64"

    def __post_init__(self):
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        object.__setattr__(self, "adam_betas", tuple(float(b) for b in self.adam_betas))
        if self.n_fields <= 0 or self.emb_dim <= 0 or self.n_dense < 0:
            raise InvalidInputError(f"need n_fields > 0, emb_dim > 0, n_dense >= 0; got "
                                    f"{self.n_fields}, {self.emb_dim}, {self.n_dense}")
        if any(h <= 0 for h in self.hidden):
            raise InvalidInputError(f"hidden widths must be > 0, got {self.hidden}")
        if self.sparse_optimizer not in ("adagrad", "sgd"):
            raise InvalidInputError(
                f"sparse_optimizer must be 'adagrad' or 'sgd', got {self.sparse_optimizer!r}")
        if self.dense_optimizer not in ("adam", "sgd"):
            raise InvalidInputError(f"dense_optimizer must be 'adam' or 'sgd', got {self.dense_optimizer!r}")
        if not (self.sparse_lr > 0 and self.dense_lr > 0 and self.emb_init_scale >= 0):
            raise InvalidInputError("learning rates must be > 0 and emb_init_scale >= 0")
        if not all(0.0 <= b < 1.0 for b in self.adam_betas) or len(self.adam_betas) != 2:
            raise InvalidInputError(f"adam_betas must be two values in [0, 1), got {self.adam_betas}")
        if self.dtype not in ("float32", "float64"):
            raise InvalidInputError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")


def _scatter_add_for(xp):
    """``scatter_add(out, idx, values)`` (out[idx] += values, duplicates summed) for array module xp."""
    if xp is np:
        return np.add.at
    try:
        import cupy
        import cupyx
    except ImportError:  # pragma: no cover - any other xp must bring its own
        cupy = None
    if cupy is not None and xp is cupy:
        return cupyx.scatter_add
    raise InvalidInputError(f"no scatter-add known for array module {xp!r}")


class CTRModel:
    """Dense part of the CTR model plus the pooling of embedding rows handed in by the caller.

    The model does not own embeddings: the caller pulls the rows of a mini-batch's unique keys from
    its table, calls :meth:`forward_backward`, and applies a sparse optimizer to the returned gradient.
    Dense parameters live in :attr:`params` (ordered dict ``W0, b0, ..., W{L}, b{L}``; ``Wi`` (in, out),
    ``bi`` (out,), the last layer has out = 1) as arrays of ``xp`` and dtype :attr:`dtype`.

    Initialisation (deterministic from ``seed``; drawn in float64 with ``numpy.random.default_rng(seed)``
    in the order W0, W1, ..., then cast): hidden layers He-uniform ``U(±sqrt(6 / fan_in))`` (ReLU), the
    output layer Xavier-uniform ``U(±sqrt(6 / (fan_in + 1)))``, every bias 0.

    Not thread-safe: one trainer thread calls it; :meth:`predict` only reads the parameters.
    """

    def __init__(self, n_fields: int, emb_dim: int, n_dense: int = 0, hidden=(256, 128), seed: int = 0,
                 xp=np, dtype=np.float32):
        cfg = ModelConfig(n_fields=n_fields, emb_dim=emb_dim, n_dense=n_dense, hidden=tuple(hidden),
                          seed=seed, dtype=np.dtype(dtype).name)
        self.n_fields, self.emb_dim, self.n_dense = cfg.n_fields, cfg.emb_dim, cfg.n_dense
        self.hidden, self.seed = cfg.hidden, cfg.seed
        self.xp = xp
        self.dtype = np.dtype(cfg.dtype)
        #: True: Numba kernels pool on the host (NumPy); False: gather + scatter-add (CuPy, tests)
        self.use_cpu_kernels = xp is np
        self.params: dict = {}
        rng = np.random.default_rng(seed)
        widths = [self.input_dim, *self.hidden, 1]
        n_layers = len(widths) - 1
        for i in range(n_layers):
            fan_in, fan_out = widths[i], widths[i + 1]
            bound = np.sqrt(6.0 / fan_in) if i < n_layers - 1 else np.sqrt(6.0 / (fan_in + fan_out))
            w = rng.uniform(-bound, bound, size=(fan_in, fan_out))
            self.params[f"W{i}"] = xp.asarray(w.astype(self.dtype))
            self.params[f"b{i}"] = xp.zeros(fan_out, dtype=self.dtype)

    @classmethod
    def from_config(cls, cfg: ModelConfig, xp=np) -> "CTRModel":
        return cls(cfg.n_fields, cfg.emb_dim, cfg.n_dense, cfg.hidden, cfg.seed, xp=xp, dtype=cfg.dtype)

    @property
    def input_dim(self) -> int:
        """Width of the MLP input: ``n_fields * emb_dim + n_dense``."""
        return self.n_fields * self.emb_dim + self.n_dense

    @property
    def n_layers(self) -> int:
        return len(self.hidden) + 1

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
    def predict(self, emb_rows, inv, batch: Batch):
        """Click probabilities (n,) of ``batch``. Arguments as in :meth:`forward_backward`. Blocking."""
        x, _ = self._inputs(emb_rows, inv, batch)
        z, _ = self._mlp_forward(x)
        return _sigmoid(self.xp, z)

    def forward_backward(self, emb_rows, inv, batch: Batch, n_total: int | None = None):
        """Loss and gradients of one mini-batch (or of this rank's share of a global mini-batch).

        emb_rows (u, d) float, xp: embedding vectors of the mini-batch's unique keys.
        inv (nnz,) int, xp or host: unique row of each key occurrence (any order of the unique keys,
            e.g. ``np.unique(return_inverse=True)`` or first-occurrence order as the trainer uses).
        batch: host :class:`Batch` with ``n`` examples and ``nnz`` keys.
        n_total: examples of the GLOBAL mini-batch; default ``n``. Loss and gradients are those of
            ``sum(bce over this batch) / n_total``, so shares of a global mini-batch (each called with
            the same ``n_total``) have gradients and losses that SUM to the single-process ones.

        Returns ``(loss, probs, grad_emb, dense_grads)``: loss a Python float (this share's term of the
        global mean), probs (n,) xp, grad_emb (u, d) xp — the gradient w.r.t. each unique row, summed
        over all its occurrences — and dense_grads a dict with the keys and shapes of :attr:`params`.
        Blocks until the loss is on the host.
        """
        xp = self.xp
        n = len(batch)
        denom = n if n_total is None else int(n_total)
        if n_total is not None and (denom <= 0 or denom < n):
            raise InvalidInputError(f"n_total must be >= the {n} local examples and > 0, got {n_total}")
        x, (emb_rows, inv, f, w, off) = self._inputs(emb_rows, inv, batch)
        z, acts = self._mlp_forward(x)
        y = xp.asarray(batch.labels).astype(self.dtype, copy=False)
        if n == 0:
            grads = {k: xp.zeros_like(v) for k, v in self.params.items()}
            return 0.0, z, xp.zeros_like(emb_rows), grads
        # bce(z, y) = softplus(z) - y z = max(z, 0) - y z + log1p(exp(-|z|))
        loss = float((xp.maximum(z, 0) - y * z + xp.log1p(xp.exp(-xp.abs(z)))).sum()) / denom
        probs = _sigmoid(xp, z)
        dh = ((probs - y) / self.dtype.type(denom))[:, None]           # d loss / d z, (n, 1)
        grads = {}
        for i in reversed(range(self.n_layers)):
            h_in = acts[i]
            grads[f"W{i}"] = h_in.T @ dh
            grads[f"b{i}"] = dh.sum(axis=0)
            W = self.params[f"W{i}"]
            if i > 0:
                dh = (dh @ W.T) * (h_in > 0)                              # through ReLU of layer i-1
            else:
                dh = dh @ W[: self.n_fields * self.emb_dim].T             # pooled part only
        grads = {k: grads[k] for k in self.params}
        grad_emb = self._pool_backward(xp.ascontiguousarray(dh), emb_rows.shape[0], inv, f, w, off)
        return loss, probs, grad_emb, grads

    # -- internals ---------------------------------------------------------------------------------
    def _inputs(self, emb_rows, inv, batch: Batch):
        """Validate, move to xp, pool; returns the MLP input (n, input_dim) and the moved arrays."""
        xp = self.xp
        if batch.n_fields != self.n_fields:
            raise InvalidInputError(f"batch has {batch.n_fields} fields, model {self.n_fields}")
        n, nnz = len(batch), int(batch.offsets[-1]) if len(batch.offsets) else 0
        emb_rows = xp.asarray(emb_rows)
        if emb_rows.dtype != self.dtype:
            emb_rows = emb_rows.astype(self.dtype)
        emb_rows = xp.ascontiguousarray(emb_rows)
        if emb_rows.ndim != 2 or emb_rows.shape[1] != self.emb_dim:
            raise InvalidInputError(f"emb_rows must be (u, {self.emb_dim}), got {tuple(emb_rows.shape)}")
        if inv.shape != (nnz,) or batch.keys.shape[0] != nnz:
            raise InvalidInputError(f"inv must be ({nnz},) like batch.keys, got {tuple(inv.shape)}")
        if batch.dense.shape != (n, self.n_dense):
            raise InvalidInputError(f"batch.dense must be ({n}, {self.n_dense}), got {batch.dense.shape}")
        f = batch.field
        if nnz:
            if int(inv.min()) < 0 or int(inv.max()) >= emb_rows.shape[0]:
                raise InvalidInputError(f"inv must index the {emb_rows.shape[0]} unique rows")
            if int(f.min()) < 0 or int(f.max()) >= self.n_fields:
                raise InvalidInputError(f"batch.field must be in [0, {self.n_fields})")
        inv = xp.ascontiguousarray(xp.asarray(inv, dtype=np.int64))
        f = xp.ascontiguousarray(xp.asarray(f, dtype=np.int32))
        w = xp.ascontiguousarray(xp.asarray(batch.weights, dtype=self.dtype))
        off = xp.ascontiguousarray(xp.asarray(batch.offsets, dtype=np.int64))
        pooled = self._pool(emb_rows, inv, f, w, off, n)
        if self.n_dense:
            dense = xp.asarray(batch.dense).astype(self.dtype, copy=False)
            x = xp.concatenate([pooled, dense], axis=1)
        else:
            x = pooled
        return x, (emb_rows, inv, f, w, off)

    def _mlp_forward(self, x):
        """Logits (n,) and the input of every layer (``acts[i]`` feeds layer i)."""
        xp, acts, h = self.xp, [], x
        for i in range(self.n_layers):
            acts.append(h)
            h = h @ self.params[f"W{i}"] + self.params[f"b{i}"]
            if i < self.n_layers - 1:
                h = xp.maximum(h, 0)
        return h[:, 0], acts

    def _pool(self, emb_rows, inv, f, w, off, n):
        xp, F, d = self.xp, self.n_fields, self.emb_dim
        out = xp.zeros((n, F * d), dtype=self.dtype)
        if self.use_cpu_kernels:
            _kernels.pool_fields(emb_rows, inv, f, w, off, out)
        elif inv.shape[0]:
            slot = _example_of(xp, off, inv.shape[0]) * F + f
            _scatter_add_for(xp)(out.reshape(n * F, d), slot, emb_rows[inv] * w[:, None])
        return out

    def _pool_backward(self, grad_pooled, u, inv, f, w, off):
        xp, F, d = self.xp, self.n_fields, self.emb_dim
        out = xp.zeros((u, d), dtype=self.dtype)
        if self.use_cpu_kernels:
            _kernels.pool_fields_backward(grad_pooled, inv, f, w, off, out)
        elif inv.shape[0]:
            n = grad_pooled.shape[0]
            slot = _example_of(xp, off, inv.shape[0]) * F + f
            _scatter_add_for(xp)(out, inv, grad_pooled.reshape(n * F, d)[slot] * w[:, None])
        return out


def _example_of(xp, offsets, nnz):
    """(nnz,) int64: the example of each key occurrence, from CSR ``offsets`` (n + 1,)."""
    return xp.searchsorted(offsets[1:], xp.arange(nnz, dtype=np.int64), side="right").astype(np.int64)


def _sigmoid(xp, z):
    """Overflow-free sigmoid."""
    e = xp.exp(-xp.abs(z))
    return xp.where(z >= 0, 1 / (1 + e), e / (1 + e)).astype(z.dtype, copy=False)


def _to_host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)
