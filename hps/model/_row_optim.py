"""Row optimizers: update parameter ROWS that carry their own optimizer state, so the state moves
through every tier (HBM-PS, MEM-PS, SSD-PS, checkpoints) with the row.

Row layout, ``P`` the model's ``row_params`` (embedding, plus a first-order weight for wdl/deepfm)::

    [ parameters (P) | optimizer state (state_width(P)) | extra columns, copied unchanged ]

==================  ===================  =========================================================
optimizer           state columns        update (g: the key's gradient summed over the mini-batch)
==================  ===================  =========================================================
``sgd``             0                    ``w -= lr g``
``adagrad``         P (accumulator)      ``acc += g^2; w -= lr g / (sqrt(acc) + eps)``
``rowwise-adagrad`` 1 (accumulator)      ``acc += mean(g^2); w -= lr g / (sqrt(acc) + eps)`` (FBGEMM)
``adam``            2P + 1 (m, v, t)     Adam with the row's own step count ``t`` (see SparseAdam)
==================  ===================  =========================================================

L2 (``l2 > 0``): ``g += l2 * w`` on the parameter columns before the update, for the rows being
updated, i.e. the keys the global mini-batch uses (BARS' embedding regularizer).

Each optimizer's per-row update is written once (``_optim_kernels.py``): on host NumPy rows it runs as
a Numba CPU kernel, on device rows (CuPy) as a CUDA kernel (``_optim_cuda.py``, enqueued on the current
stream). Not thread-safe.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InvalidInputError
from . import _optim_kernels as K

__all__ = ["SparseSGD", "SparseAdagrad", "SparseRowwiseAdagrad", "SparseAdam"]


def _xp_of(a):
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def _check_lr(lr):
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise InvalidInputError(f"learning rate must be a finite number > 0, got {lr!r}")
    return float(lr)


def _check_l2(l2):
    if not (isinstance(l2, (int, float)) and math.isfinite(l2) and l2 >= 0):
        raise InvalidInputError(f"l2 must be a finite number >= 0, got {l2!r}")
    return float(l2)


class _SparseRowOptimizer:
    """Base of row optimizers: one update per unique key per mini-batch."""

    name = ""

    def __init__(self, lr: float, l2: float = 0.0):
        self.lr = _check_lr(lr)
        self.l2 = _check_l2(l2)

    def state_width(self, n_params: int) -> int:
        """Optimizer-state columns that follow the ``n_params`` parameter columns of a row."""
        raise NotImplementedError

    def row_width(self, n_params: int) -> int:
        """Columns of a row: ``n_params + state_width(n_params)``."""
        return n_params + self.state_width(n_params)

    @property
    def initial_state_value(self) -> float:
        """Every state column of a newborn row starts at this value."""
        return 0.0

    def initial_state(self, n: int, n_params: int, dtype=np.float32, xp=np):
        """(n, state_width) state of newborn rows."""
        return xp.full((n, self.state_width(n_params)), self.initial_state_value, dtype=dtype)

    def init_rows(self, params):
        """(n, row_width) rows made of parameters ``params`` (n, P) and the initial state."""
        xp = _xp_of(params)
        st = self.initial_state(params.shape[0], params.shape[1], params.dtype, xp)
        return xp.concatenate([params, st], axis=1)

    def apply(self, rows, grads):
        """New rows after one step. rows (u, >= row_width(P)) float; grads (u, P) float, the gradient
        of each unique key summed over the (global) mini-batch. Returns a new (u, row_width+) array
        of rows' dtype and module; ``rows`` is not modified. Blocking."""
        self._check(rows, grads)
        out = rows.copy(order="C") if _xp_of(rows) is np else rows.copy()
        return self._step(out, grads)

    def apply_in_place(self, rows, grads):
        """:meth:`apply` on ``rows`` itself (the caller's own copy, e.g. rows just read from a table):
        saves a copy of every row. Returns ``rows`` updated; a NumPy ``rows`` that is not writable and
        C-contiguous is copied first (then the copy is returned)."""
        self._check(rows, grads)
        if _xp_of(rows) is np and not (rows.flags.c_contiguous and rows.flags.writeable):
            rows = rows.copy(order="C")
        return self._step(rows, grads)

    def _check(self, rows, grads) -> None:
        if rows.ndim != 2 or grads.ndim != 2 or rows.shape[0] != grads.shape[0] \
                or rows.shape[1] < self.row_width(grads.shape[1]):
            raise InvalidInputError(f"need grads (u, P) and rows (u, >= row_width(P)) for {self!r}; got "
                                    f"rows {tuple(rows.shape)}, grads {tuple(grads.shape)}")

    def _step(self, out, grads):
        """One step on ``out`` in place (C-contiguous when NumPy) -> ``out``: the per-row functions of
        ``_optim_kernels.py`` as a Numba CPU kernel on NumPy rows, else as a CUDA kernel over every
        row (CuPy rows: ``slots = arange(u)``, enqueued on the current stream)."""
        if _xp_of(out) is np:
            self._kernel(out, np.ascontiguousarray(grads.astype(out.dtype, copy=False)))
            return out
        from ._optim_cuda import update_rows_async

        xp = _xp_of(out)
        g = xp.ascontiguousarray(grads.astype(out.dtype, copy=False))
        update_rows_async(out, xp.arange(out.shape[0], dtype=np.int64), g, self)
        return out

    def _kernel(self, out, g):  # Numba, in place
        raise NotImplementedError

    def __repr__(self):
        extra = "".join(f", {k}={v}" for k, v in self._hyper().items())
        return f"{type(self).__name__}(lr={self.lr}{extra}, l2={self.l2})"

    def _hyper(self) -> dict:
        return {}


class SparseSGD(_SparseRowOptimizer):
    """``w -= lr * g``. No state."""

    name = "sgd"

    def state_width(self, n_params: int) -> int:
        return 0

    def _kernel(self, out, g):
        K.sgd_rows(out, g, self.lr, self.l2)



class SparseAdagrad(_SparseRowOptimizer):
    """Per-element Adagrad, state = accumulator (P columns)::

        acc += g * g;   w -= lr * g / (sqrt(acc) + eps)

    ``initial_accumulator`` (default 0.0, torch's default) is the accumulator of a new row.
    """

    name = "adagrad"

    def __init__(self, lr: float, initial_accumulator: float = 0.0, eps: float = 1e-10, l2: float = 0.0):
        super().__init__(lr, l2)
        if not (initial_accumulator >= 0 and eps >= 0):
            raise InvalidInputError("initial_accumulator and eps must be >= 0")
        self.initial_accumulator = float(initial_accumulator)
        self.eps = float(eps)

    def _hyper(self):
        return {"initial_accumulator": self.initial_accumulator, "eps": self.eps}

    def state_width(self, n_params: int) -> int:
        return n_params

    @property
    def initial_state_value(self) -> float:
        return self.initial_accumulator

    def _kernel(self, out, g):
        K.adagrad_rows(out, g, self.lr, self.eps, self.l2)



class SparseRowwiseAdagrad(SparseAdagrad):
    """Row-wise Adagrad (FBGEMM's default for embeddings): ONE accumulator per row::

        acc += mean_j(g_j^2);   w -= lr * g / (sqrt(acc) + eps)

    State width 1 whatever P: a row of d = 16 is 17 floats instead of Adagrad's 32. The mean is over
    all parameter columns (for wdl/deepfm the first-order weight shares the embedding's accumulator).
    """

    name = "rowwise-adagrad"

    def state_width(self, n_params: int) -> int:
        return 1

    def _kernel(self, out, g):
        K.rowwise_adagrad_rows(out, g, self.lr, self.eps, self.l2)



class SparseAdam(_SparseRowOptimizer):
    """Adam for rows, as ``torch.optim.Adam`` per element but with each row's OWN step count ``t``,
    stored in the row: state ``[m (P) | v (P) | t (1)]``, so a row of P parameters is ``3P + 1``
    columns (d = 16: 49 floats, 196 bytes, against 32 for Adagrad)::

        t += 1;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    A row's bias correction counts the mini-batches that USED the key (a "lazy" Adam: rows that are
    not in a mini-batch neither move nor age). ``t`` is a float column: exact up to 2^24 updates of
    one key in float32. Unlike torch's ``SparseAdam`` (one step count per tensor), the update of a row
    depends only on that row's history, the same in every tier and on every rank.
    """

    name = "adam"

    def __init__(self, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, l2: float = 0.0):
        super().__init__(lr, l2)
        b1, b2 = (float(b) for b in betas)
        if not (0 <= b1 < 1 and 0 <= b2 < 1 and eps >= 0):
            raise InvalidInputError(f"need betas in [0, 1) and eps >= 0, got {betas}, {eps}")
        self.betas, self.eps = (b1, b2), float(eps)

    def _hyper(self):
        return {"betas": self.betas, "eps": self.eps}

    def state_width(self, n_params: int) -> int:
        return 2 * n_params + 1

    def _kernel(self, out, g):
        K.adam_rows(out, g, self.lr, self.betas[0], self.betas[1], self.eps, self.l2)

