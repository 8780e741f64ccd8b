"""The sparse row optimizers of ``hps.model`` as asynchronous CUDA operations on the HBM-PS rows, in
place (the device twins of ``SparseSGD`` / ``SparseAdagrad`` / ``SparseRowwiseAdagrad`` /
``SparseAdam.apply``): ``hps/model/_optim_cuda.py``'s launchers on a table view's values, whose kernels
share their math with the CPU (``hps/model/_optim_kernels.py``); and the birth of new keys' rows on the
device (``init_rows_async``, the twin of ``hps.mem.RowInitializer.fill``). Same contract as ``_train_ops``:
enqueued on ``stream``, no allocation, copy or synchronisation; ``view`` from ``table.device_view()``;
slots (u,) int64 distinct (one update per key; -1 skipped); grads (u, P) of the table dtype, the
gradient of each key summed over the global mini-batch; rows ``[parameters (P) | state | ...]``.
"""

from __future__ import annotations

import numpy as np

from .. import _launch as L
from ..errors import InvalidInputError
from ..model import _optim_cuda as R
from ._train_ops import _dev, _view

__all__ = ["sgd_update_async", "adagrad_update_async", "rowwise_adagrad_update_async", "adam_update_async",
           "sparse_update_async", "init_rows_async"]


def sgd_update_async(view, slots, grads, lr: float, l2: float = 0.0, stream=0) -> None:
    """``w -= lr * (g + l2 w)`` on the first P = grads.shape[1] columns of each slot's row."""
    R.sgd_rows_async(_view(view)[2], slots, grads, lr, l2, stream)


def adagrad_update_async(view, slots, grads, lr: float, eps: float = 1e-10, state_col: int | None = None,
                         l2: float = 0.0, stream=0) -> None:
    """Element-wise Adagrad (torch's formula), accumulator of column j at ``state_col + j`` (default P)::

        g += l2 w;   acc += g * g;   w -= lr * g / (sqrt(acc) + eps)
    """
    R.adagrad_rows_async(_view(view)[2], slots, grads, lr, eps, state_col, l2, stream)


def rowwise_adagrad_update_async(view, slots, grads, lr: float, eps: float = 1e-10, l2: float = 0.0,
                                 stream=0) -> None:
    """Row-wise Adagrad (FBGEMM's): one accumulator per row, column P::

        g += l2 w;   acc += mean_j(g_j^2);   w -= lr * g / (sqrt(acc) + eps)
    """
    R.rowwise_adagrad_rows_async(_view(view)[2], slots, grads, lr, eps, l2, stream)


def adam_update_async(view, slots, grads, lr: float, betas=(0.9, 0.999), eps: float = 1e-8, l2: float = 0.0,
                      stream=0) -> None:
    """Adam with each row's own step count, state ``[m (P) | v (P) | t (1)]`` (``SparseAdam``)."""
    R.adam_rows_async(_view(view)[2], slots, grads, lr, betas, eps, l2, stream)


def sparse_update_async(view, slots, grads, optimizer, stream=0) -> None:
    """One step of a row optimizer of ``hps.model`` (its hyperparameters, L2 and row layout) in place on
    the table rows: the device twin of ``optimizer.apply``."""
    R.update_rows_async(_view(view)[2], slots, grads, optimizer, stream)


def init_rows_async(keys, idx, initializer, out, stream=0) -> None:
    """Rows of keys new to every tier made on the device: for every r in ``idx`` (m,) int64, ``out[r]``
    (out (n, W) float32) = the initial row of ``keys[r]`` (keys (n,) uint64) by ``initializer``'s rule
    (an ``hps.mem.RowInitializer``: the same bits as its host ``fill``, ``hps/mem/_init_kernels_cuda.py``).
    Asynchronous; the other rows of ``out`` are not touched."""
    from ..mem import _init_kernels_cuda as IK
    from ..mem._init_kernels import seed_base

    keys = _dev(keys, "keys", np.uint64, 1)
    idx = _dev(idx, "idx", np.int64, 1)
    out = _dev(out, "out", np.float32, 2)
    if out.shape != (keys.shape[0], initializer.row_width):
        raise InvalidInputError(f"out must be ({keys.shape[0]}, {initializer.row_width}) for the keys and the "
                                f"initializer's row width, got {tuple(out.shape)}")
    if idx.shape[0]:
        L.launch(IK.init_rows, L.grid_rows(idx.shape[0], out.shape[1]), stream, keys, idx,
                 np.uint64(seed_base(np.uint64(initializer.seed))),
                 initializer.emb_dim, initializer.scale, np.float32(initializer.state_value), out)
