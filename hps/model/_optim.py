"""Optimizers. Sparse ones update parameter ROWS that carry their own state; dense ones update the
model's named dense tensors and keep their state for checkpoints.

Row layout (every tier moves whole rows)::

    [ embedding (emb_dim) | optimizer state (state_width(emb_dim)) | extra columns, copied unchanged ]

Formulas follow ``torch.optim`` (Adagrad with lr_decay = weight_decay = 0, Adam without amsgrad and
weight decay) so a PyTorch peer started from the same values takes the same steps.
Arrays may be NumPy or CuPy; every method works on the array module of its inputs. Vectorised; not
thread-safe (one trainer thread owns an optimizer).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidInputError

__all__ = ["SparseSGD", "SparseAdagrad", "DenseSGD", "DenseAdam",
           "make_sparse_optimizer", "make_dense_optimizer", "make_optimizers"]


def _xp_of(a):
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _check_lr(lr):
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise InvalidInputError(f"learning rate must be a finite number > 0, got {lr!r}")
    return float(lr)


class _SparseRowOptimizer:
    """Base of row optimizers: one update per unique key per mini-batch."""

    name = ""

    def state_width(self, emb_dim: int) -> int:
        """Optimizer-state columns that follow the embedding in a row."""
        raise NotImplementedError

    def row_width(self, emb_dim: int) -> int:
        """Columns of a row: ``emb_dim + state_width(emb_dim)``."""
        return emb_dim + self.state_width(emb_dim)

    def initial_state(self, n: int, emb_dim: int, dtype=np.float32, xp=np):
        """(n, state_width) state of newly born rows."""
        return xp.zeros((n, self.state_width(emb_dim)), dtype=dtype)

    def init_rows(self, emb):
        """(n, row_width) rows made of embeddings ``emb`` (n, emb_dim) and the initial state."""
        xp = _xp_of(emb)
        st = self.initial_state(emb.shape[0], emb.shape[1], emb.dtype, xp)
        return xp.concatenate([emb, st], axis=1)

    def apply(self, rows, grads):
        """New rows after one step. rows (u, >= row_width) float; grads (u, emb_dim) float, the
        gradient of each unique key summed over the (global) mini-batch. Returns a new (u, row_width+)
        array of rows' dtype and module; ``rows`` is not modified."""
        if rows.ndim != 2 or grads.ndim != 2 or rows.shape[0] != grads.shape[0] \
                or rows.shape[1] < self.row_width(grads.shape[1]):
            raise InvalidInputError(f"need grads (u, emb_dim) and rows (u, >= row_width(emb_dim)) for "
                                    f"{self!r}; got rows {tuple(rows.shape)}, grads {tuple(grads.shape)}")
        out = rows.copy()
        self._update(out, grads.astype(rows.dtype, copy=False), _xp_of(rows))
        return out

    def _update(self, out, g, xp):  # in place on the copy
        raise NotImplementedError


class SparseSGD(_SparseRowOptimizer):
    """``w -= lr * g``. No state."""

    name = "sgd"

    def __init__(self, lr: float):
        self.lr = _check_lr(lr)

    def state_width(self, emb_dim: int) -> int:
        return 0

    def _update(self, out, g, xp):
        d = g.shape[1]
        out[:, :d] -= out.dtype.type(self.lr) * g

    def __repr__(self):
        return f"SparseSGD(lr={self.lr})"


class SparseAdagrad(_SparseRowOptimizer):
    """Per-element Adagrad, state = accumulator (emb_dim columns)::

        acc += g * g;   w -= lr * g / (sqrt(acc) + eps)

    ``initial_accumulator`` (default 0.0, torch's default) is the accumulator of a new row.
    """

    name = "adagrad"

    def __init__(self, lr: float, initial_accumulator: float = 0.0, eps: float = 1e-10):
        self.lr = _check_lr(lr)
        if not (initial_accumulator >= 0 and eps >= 0):
            raise InvalidInputError("initial_accumulator and eps must be >= 0")
        self.initial_accumulator = float(initial_accumulator)
        self.eps = float(eps)

    def state_width(self, emb_dim: int) -> int:
        return emb_dim

    def initial_state(self, n: int, emb_dim: int, dtype=np.float32, xp=np):
        return xp.full((n, emb_dim), self.initial_accumulator, dtype=dtype)

    def _update(self, out, g, xp):
        d = g.shape[1]
        t = out.dtype.type
        acc = out[:, d:2 * d]
        acc += g * g
        out[:, :d] -= t(self.lr) * g / (xp.sqrt(acc) + t(self.eps))

    def __repr__(self):
        return f"SparseAdagrad(lr={self.lr}, initial_accumulator={self.initial_accumulator}, eps={self.eps})"


class _DenseOptimizer:
    """Base of dense optimizers: ``step(params, grads)`` updates the arrays of ``params`` in place."""

    name = ""
    _slots: tuple[str, ...] = ()

    def __init__(self):
        self.t = 0
        self._state: dict[str, dict] = {s: {} for s in self._slots}

    def step(self, params: dict, grads: dict) -> None:
        """One step. params/grads: dicts name -> array (same names, shapes); params updated in place."""
        if set(grads) != set(params):
            raise InvalidInputError(f"grad names {sorted(grads)} != param names {sorted(params)}")
        self.t += 1
        for k, p in params.items():
            g = grads[k]
            if g.shape != p.shape:
                raise InvalidInputError(f"{k}: grad shape {tuple(g.shape)} != param {tuple(p.shape)}")
            xp = _xp_of(p)
            st = {}
            for s in self._slots:
                a = self._state[s].get(k)
                if a is None:
                    a = xp.zeros_like(p)
                elif _xp_of(a) is not xp or a.dtype != p.dtype:  # loaded from a host checkpoint
                    a = xp.asarray(a, dtype=p.dtype)
                self._state[s][k] = st[s] = a
            self._update(p, g.astype(p.dtype, copy=False), st, xp)

    def _update(self, p, g, st, xp):
        raise NotImplementedError

    def _hyper(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        """Host copies: ``{"name", "step", <hyperparameters>, <slot>: {param name: array}}``."""
        d = {"name": self.name, "step": self.t, **self._hyper()}
        for s in self._slots:
            d[s] = {k: (a.get() if hasattr(a, "get") else np.array(a)) for k, a in self._state[s].items()}
        return d

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict` (of the same optimizer kind; hyperparameters are taken too)."""
        if state.get("name") != self.name:
            raise InvalidInputError(f"state of optimizer {state.get('name')!r} loaded into {self.name!r}")
        self.t = int(state["step"])
        for k in self._hyper():
            if k in state:
                setattr(self, k, tuple(float(b) for b in state[k]) if k == "betas" else float(state[k]))
        self._state = {s: {k: np.array(a) for k, a in state.get(s, {}).items()} for s in self._slots}


class DenseSGD(_DenseOptimizer):
    """``p -= lr * g``."""

    name = "sgd"

    def __init__(self, lr: float):
        super().__init__()
        self.lr = _check_lr(lr)

    def _hyper(self):
        return {"lr": self.lr}

    def _update(self, p, g, st, xp):
        p -= p.dtype.type(self.lr) * g


class DenseAdam(_DenseOptimizer):
    """Adam as ``torch.optim.Adam`` (no amsgrad, no weight decay); step count ``t`` starts at 1::

        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    """

    name = "adam"
    _slots = ("m", "v")

    def __init__(self, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        super().__init__()
        self.lr = _check_lr(lr)
        b1, b2 = (float(b) for b in betas)
        if not (0 <= b1 < 1 and 0 <= b2 < 1 and eps >= 0):
            raise InvalidInputError(f"need betas in [0, 1) and eps >= 0, got {betas}, {eps}")
        self.betas, self.eps = (b1, b2), float(eps)

    def _hyper(self):
        return {"lr": self.lr, "betas": self.betas, "eps": self.eps}

    def _update(self, p, g, st, xp):
        b1, b2 = self.betas
        t = p.dtype.type
        m, v = st["m"], st["v"]
        m *= t(b1)
        m += t(1 - b1) * g
        v *= t(b2)
        v += t(1 - b2) * (g * g)
        step_size = self.lr / (1 - b1 ** self.t)
        bc2_sqrt = math.sqrt(1 - b2 ** self.t)
        p -= t(step_size) * m / (xp.sqrt(v) / t(bc2_sqrt) + t(self.eps))


_SPARSE = {"adagrad": SparseAdagrad, "sgd": SparseSGD}
_DENSE = {"adam": DenseAdam, "sgd": DenseSGD}


def make_sparse_optimizer(name: str, lr: float, **kwargs):
    """``"adagrad"`` (:class:`SparseAdagrad`, default) or ``"sgd"`` (:class:`SparseSGD`)."""
    if name not in _SPARSE:
        raise InvalidInputError(f"unknown sparse optimizer {name!r}; choose from {sorted(_SPARSE)}")
    return _SPARSE[name](lr, **kwargs)


def make_dense_optimizer(name: str, lr: float, **kwargs):
    """``"adam"`` (:class:`DenseAdam`, default) or ``"sgd"`` (:class:`DenseSGD`)."""
    if name not in _DENSE:
        raise InvalidInputError(f"unknown dense optimizer {name!r}; choose from {sorted(_DENSE)}")
    return _DENSE[name](lr, **kwargs)


def make_optimizers(cfg):
    """(sparse, dense) optimizers described by a :class:`~hps.model.ModelConfig`."""
    if cfg.sparse_optimizer == "adagrad":
        sparse = SparseAdagrad(cfg.sparse_lr, cfg.adagrad_initial_accumulator, cfg.adagrad_eps)
    else:
        sparse = make_sparse_optimizer(cfg.sparse_optimizer, cfg.sparse_lr)
    if cfg.dense_optimizer == "adam":
        dense = DenseAdam(cfg.dense_lr, cfg.adam_betas, cfg.adam_eps)
    else:
        dense = make_dense_optimizer(cfg.dense_optimizer, cfg.dense_lr)
    return sparse, dense
