"""CUDA kernels of the row optimizers: the per-row updates of ``_optim_kernels.py`` (written once for
CPU and GPU) applied to rows on the device, in place.

``tvals`` (S, W) float: rows (a table's slots, or a batch of rows); ``slots`` (u,) int64: the row of
each gradient, -1 to skip; ``grads`` (u, P) of the rows' dtype. The training path runs them on an
HBM-PS table's rows (``hps/gpu/_row_ops.py``); ``SparseSGD.apply`` & co. run them on CuPy rows with
``slots = arange(u)`` (``_row_optim.py``). Launch shapes: ``hps._launch``. Kernels only.
"""

from __future__ import annotations

from numba import cuda

from .._grid_kernels import row0, row_step
from ._optim_kernels import adagrad_row, adam_row, rowwise_adagrad_row, sgd_row


@cuda.jit
def sgd_rows(tvals, slots, grads, lr, l2):
    """Row kernel over the u unique keys, in place on the table rows: ``sgd_row`` on the P =
    grads.shape[1] parameter columns of slot s = slots[i], the x-threads striding the columns; slots
    of -1 are skipped. REQUIRES: slots distinct (one update per key)."""
    for i in range(row0(), slots.shape[0], row_step()):
        s = slots[i]
        if s >= 0:
            sgd_row(tvals, s, grads, i, lr, l2, cuda.threadIdx.x, cuda.blockDim.x)


@cuda.jit
def adagrad_rows(tvals, slots, grads, lr, eps, l2, state_col):
    """Row kernel over the u unique keys, element-wise Adagrad in place (``adagrad_row``), the
    accumulator of parameter column j at column ``state_col + j``. Slots of -1 are skipped.
    REQUIRES: slots distinct (one update per key)."""
    for i in range(row0(), slots.shape[0], row_step()):
        s = slots[i]
        if s >= 0:
            adagrad_row(tvals, s, grads, i, lr, eps, l2, state_col, cuda.threadIdx.x, cuda.blockDim.x)


@cuda.jit
def rowwise_adagrad_rows(tvals, slots, grads, lr, eps, l2):
    """1-D over the u unique keys (one thread per row: the row's mean needs every column), row-wise
    Adagrad in place (``rowwise_adagrad_row``). Slots of -1 are skipped. REQUIRES: slots distinct."""
    for i in range(cuda.grid(1), slots.shape[0], cuda.gridsize(1)):
        s = slots[i]
        if s >= 0:
            rowwise_adagrad_row(tvals, s, grads, i, lr, eps, l2)


@cuda.jit
def adam_rows(tvals, slots, grads, lr64, b1, b2, eps, l2):
    """1-D over the u unique keys (one thread per row: the row's step count is shared by its
    columns), Adam in place with the row's own step count (``adam_row``). ``lr64``, ``b1``, ``b2``
    float64. Slots of -1 are skipped. REQUIRES: slots distinct."""
    for i in range(cuda.grid(1), slots.shape[0], cuda.gridsize(1)):
        s = slots[i]
        if s >= 0:
            adam_row(tvals, s, grads, i, lr64, b1, b2, eps, l2)
