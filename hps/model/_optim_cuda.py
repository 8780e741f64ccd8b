"""The row optimizers' CUDA launchers: validated, asynchronous functions over device rows, in place.

``rows`` (S, W) float device rows (an HBM-PS table's slot values, or a batch of rows); ``slots`` (u,)
int64 the row of each gradient, distinct (one update per key; -1 skipped); ``grads`` (u, P) of the
rows' dtype; rows ``[parameters (P) | state | ...]`` (layouts in ``_row_optim.py``). Each function
enqueues one kernel of ``_optim_kernels_cuda.py`` on ``stream`` and returns: no allocation, copy or
synchronisation. Device arrays are CuPy or Numba ones, or NumPy under the CUDA simulator
(``hps._launch.arg``). Used by ``hps.gpu``'s operations on table views and by ``SparseSGD.apply`` & co.
on CuPy rows.
"""

from __future__ import annotations

import numpy as np

from .. import _launch as L
from ..errors import InvalidInputError

try:
    from . import _optim_kernels_cuda as K
except Exception:  # numba-cuda missing or broken: reported when a function is called (_launch.cuda)
    K = None

__all__ = ["sgd_rows_async", "adagrad_rows_async", "rowwise_adagrad_rows_async", "adam_rows_async",
           "update_rows_async"]


def _finite(x, name: str, positive: bool) -> None:
    if not (np.isfinite(x) and (x > 0 if positive else x >= 0)):
        raise InvalidInputError(f"{name} must be a finite number {'>' if positive else '>='} 0, got {x!r}")


def _args(rows, slots, grads, lr, l2, state: int):
    """(rows, slots, grads, lr, l2) checked device arrays and scalars; ``state``: columns of optimizer
    state the rows need after the P parameters."""
    L.cuda("the row optimizers' CUDA kernels")
    tvals = L.arg(rows, "rows", None, 2)
    slots = L.arg(slots, "slots", np.int64, 1)
    grads = L.arg(grads, "grads", tvals.dtype, 2)
    L.check_len(grads, slots.shape[0], "grads", "one per slot")
    p = grads.shape[1]
    if p == 0 or p + state > tvals.shape[1]:
        raise InvalidInputError(f"grads of {p} columns need rows of at least {p} + {state} (state) columns "
                                f"and P >= 1; the rows have {tvals.shape[1]}")
    _finite(lr, "learning rate", True)
    _finite(l2, "l2", False)
    t = tvals.dtype.type
    return tvals, slots, grads, t(lr), t(l2)


def sgd_rows_async(rows, slots, grads, lr: float, l2: float = 0.0, stream=0) -> None:
    """``w -= lr * (g + l2 w)`` on the first P = grads.shape[1] columns of each row ``rows[slots[i]]``."""
    tvals, slots, grads, lr, l2 = _args(rows, slots, grads, lr, l2, 0)
    if slots.shape[0]:
        L.launch(K.sgd_rows, L.grid_rows(slots.shape[0], grads.shape[1]), stream, tvals, slots, grads, lr, l2)


def adagrad_rows_async(rows, slots, grads, lr: float, eps: float = 1e-10, state_col: int | None = None,
                         l2: float = 0.0, stream=0) -> None:
    """Element-wise Adagrad (torch's formula), accumulator of column j at ``state_col + j`` (default P)::

        g += l2 w;   acc += g * g;   w -= lr * g / (sqrt(acc) + eps)
    """
    p = grads.shape[1] if grads.ndim == 2 else 0
    state_col = p if state_col is None else int(state_col)
    tvals, slots, grads, lr, l2 = _args(rows, slots, grads, lr, l2, 0)
    if state_col < p or state_col + p > tvals.shape[1]:
        raise InvalidInputError(f"the accumulator columns [{state_col}, {state_col + p}) must lie after the "
                                f"{p} parameter columns and within the row width {tvals.shape[1]}")
    _finite(eps, "eps", False)
    if slots.shape[0]:
        L.launch(K.adagrad_rows, L.grid_rows(slots.shape[0], p), stream, tvals, slots, grads, lr,
                 tvals.dtype.type(eps), l2, state_col)


def rowwise_adagrad_rows_async(rows, slots, grads, lr: float, eps: float = 1e-10, l2: float = 0.0,
                                 stream=0) -> None:
    """Row-wise Adagrad (FBGEMM's): one accumulator per row, column P::

        g += l2 w;   acc += mean_j(g_j^2);   w -= lr * g / (sqrt(acc) + eps)
    """
    tvals, slots, grads, lr, l2 = _args(rows, slots, grads, lr, l2, 1)
    _finite(eps, "eps", False)
    if slots.shape[0]:
        L.launch(K.rowwise_adagrad_rows, L.grid1(slots.shape[0]), stream, tvals, slots, grads, lr,
                 tvals.dtype.type(eps), l2)


def adam_rows_async(rows, slots, grads, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, l2: float = 0.0,
                      stream=0) -> None:
    """Adam with each row's own step count, state ``[m (P) | v (P) | t (1)]`` (``SparseAdam``)."""
    tvals, slots, grads, _, l2 = _args(rows, slots, grads, lr, l2, 2 * grads.shape[1] + 1)
    b1, b2 = (float(b) for b in betas)
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise InvalidInputError(f"betas must lie in [0, 1), got {betas!r}")
    _finite(eps, "eps", False)
    if slots.shape[0]:
        L.launch(K.adam_rows, L.grid1(slots.shape[0]), stream, tvals, slots, grads, float(lr), b1, b2,
                 tvals.dtype.type(eps), l2)


def update_rows_async(rows, slots, grads, optimizer, stream=0) -> None:
    """One step of a row optimizer (its hyperparameters, L2 and row layout) in place on the device rows
    ``rows[slots[i]]`` with gradients ``grads[i]``: the device twin of ``optimizer.apply``."""
    name = getattr(optimizer, "name", None)
    if name == "sgd":
        sgd_rows_async(rows, slots, grads, optimizer.lr, optimizer.l2, stream)
    elif name == "adagrad":
        adagrad_rows_async(rows, slots, grads, optimizer.lr, optimizer.eps, None, optimizer.l2, stream)
    elif name == "rowwise-adagrad":
        rowwise_adagrad_rows_async(rows, slots, grads, optimizer.lr, optimizer.eps, optimizer.l2, stream)
    elif name == "adam":
        adam_rows_async(rows, slots, grads, optimizer.lr, optimizer.betas, optimizer.eps, optimizer.l2, stream)
    else:
        raise InvalidInputError(f"no GPU kernel for sparse optimizer {optimizer!r}; GPU rows take 'sgd', "
                                "'adagrad', 'rowwise-adagrad' or 'adam'")
