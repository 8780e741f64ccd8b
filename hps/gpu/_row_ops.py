"""The sparse row optimizers of ``hps.model`` as asynchronous CUDA operations on the HBM-PS rows, in
place (the device twins of ``SparseSGD`` / ``SparseAdagrad`` / ``SparseRowwiseAdagrad`` /
``SparseAdam.apply``; kernels in ``_train_kernels``). Same contract as ``_train_ops``: enqueued on
``stream``, no allocation, copy or synchronisation; ``view`` from ``table.device_view()``; slots
(u,) int64 distinct (one update per key; -1 skipped); grads (u, P) of the table dtype, the gradient
of each key summed over the global mini-batch; rows ``[parameters (P) | state | ...]``.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from .. import _launch as L
from ._train_ops import K, _check_len, _dev, _view

__all__ = ["sgd_update_async", "adagrad_update_async", "rowwise_adagrad_update_async", "adam_update_async",
           "sparse_update_async"]


def _finite(x, name: str, positive: bool) -> None:
    if not (np.isfinite(x) and (x > 0 if positive else x >= 0)):
        raise InvalidInputError(f"{name} must be a finite number {'>' if positive else '>='} 0, got {x!r}")


def _args(view, slots, grads, lr, l2, state: int):
    """(table values, slots, grads, lr, l2) checked; ``state``: columns of optimizer state the rows
    need after the P parameters."""
    tvals = _view(view)[2]
    slots = _dev(slots, "slots", np.int64, 1)
    grads = _dev(grads, "grads", tvals.dtype, 2)
    _check_len(grads, slots.shape[0], "grads", "one per slot")
    p = grads.shape[1]
    if p == 0 or p + state > tvals.shape[1]:
        raise InvalidInputError(f"grads of {p} columns need rows of at least {p} + {state} (state) columns "
                                f"and P >= 1; the table's rows have {tvals.shape[1]}")
    _finite(lr, "learning rate", True)
    _finite(l2, "l2", False)
    t = tvals.dtype.type
    return tvals, slots, grads, t(lr), t(l2)


def sgd_update_async(view, slots, grads, lr: float, l2: float = 0.0, stream=0) -> None:
    """``w -= lr * (g + l2 w)`` on the first P = grads.shape[1] columns of each slot's row."""
    tvals, slots, grads, lr, l2 = _args(view, slots, grads, lr, l2, 0)
    if slots.shape[0]:
        L.launch(K.sgd_rows, L.grid_rows(slots.shape[0], grads.shape[1]), stream, tvals, slots, grads, lr, l2)


def adagrad_update_async(view, slots, grads, lr: float, eps: float = 1e-10, state_col: int | None = None,
                         l2: float = 0.0, stream=0) -> None:
    """Element-wise Adagrad (torch's formula), accumulator of column j at ``state_col + j`` (default P)::

        g += l2 w;   acc += g * g;   w -= lr * g / (sqrt(acc) + eps)
    """
    p = grads.shape[1] if grads.ndim == 2 else 0
    state_col = p if state_col is None else int(state_col)
    tvals, slots, grads, lr, l2 = _args(view, slots, grads, lr, l2, 0)
    if state_col < p or state_col + p > tvals.shape[1]:
        raise InvalidInputError(f"the accumulator columns [{state_col}, {state_col + p}) must lie after the "
                                f"{p} parameter columns and within the row width {tvals.shape[1]}")
    _finite(eps, "eps", False)
    if slots.shape[0]:
        L.launch(K.adagrad_rows, L.grid_rows(slots.shape[0], p), stream, tvals, slots, grads, lr,
                 tvals.dtype.type(eps), l2, state_col)


def rowwise_adagrad_update_async(view, slots, grads, lr: float, eps: float = 1e-10, l2: float = 0.0,
                                 stream=0) -> None:
    """Row-wise Adagrad (FBGEMM's): one accumulator per row, column P::

        g += l2 w;   acc += mean_j(g_j^2);   w -= lr * g / (sqrt(acc) + eps)
    """
    tvals, slots, grads, lr, l2 = _args(view, slots, grads, lr, l2, 1)
    _finite(eps, "eps", False)
    if slots.shape[0]:
        L.launch(K.rowwise_adagrad_rows, L.grid1(slots.shape[0]), stream, tvals, slots, grads, lr,
                 tvals.dtype.type(eps), l2)


def adam_update_async(view, slots, grads, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, l2: float = 0.0,
                      stream=0) -> None:
    """Adam with each row's own step count, state ``[m (P) | v (P) | t (1)]`` (``SparseAdam``)."""
    tvals, slots, grads, _, l2 = _args(view, slots, grads, lr, l2, 2 * grads.shape[1] + 1)
    b1, b2 = (float(b) for b in betas)
    if not (0 <= b1 < 1 and 0 <= b2 < 1):
        raise InvalidInputError(f"betas must lie in [0, 1), got {betas!r}")
    _finite(eps, "eps", False)
    if slots.shape[0]:
        L.launch(K.adam_rows, L.grid1(slots.shape[0]), stream, tvals, slots, grads, float(lr), b1, b2,
                 tvals.dtype.type(eps), l2)


def sparse_update_async(view, slots, grads, optimizer, stream=0) -> None:
    """One step of a row optimizer of ``hps.model`` (its hyperparameters, L2 and row layout) in place on
    the table rows: the device twin of ``optimizer.apply``."""
    name = getattr(optimizer, "name", None)
    if name == "sgd":
        sgd_update_async(view, slots, grads, optimizer.lr, optimizer.l2, stream)
    elif name == "adagrad":
        adagrad_update_async(view, slots, grads, optimizer.lr, optimizer.eps, None, optimizer.l2, stream)
    elif name == "rowwise-adagrad":
        rowwise_adagrad_update_async(view, slots, grads, optimizer.lr, optimizer.eps, optimizer.l2, stream)
    elif name == "adam":
        adam_update_async(view, slots, grads, optimizer.lr, optimizer.betas, optimizer.eps, optimizer.l2, stream)
    else:
        raise InvalidInputError(f"no GPU kernel for sparse optimizer {optimizer!r}; GPU rows take 'sgd', "
                                "'adagrad', 'rowwise-adagrad' or 'adam'")
