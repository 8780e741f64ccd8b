"""The row optimizers' per-row updates, written once for the CPU and the GPU, and their CPU kernels.

Each ``*_row`` function is plain Python that Numba compiles for whichever target calls it (an
``overload`` of target ``"generic"``): the CPU kernels below (``@njit(nogil=True, cache=True)``) and
the CUDA kernels of ``hps/gpu/_train_kernels.py`` call the same function, and Numba's CUDA simulator
runs it as Python. They live in this file so that Numba's on-disk cache of the CPU kernels is
invalidated whenever they change.

Arguments of a ``*_row`` function: ``w`` (S, W) the rows (a table's slots on the GPU, a batch of rows
on the CPU) and ``s`` the row to update; ``g`` (u, P) the gradients and ``i`` the row of ``g`` for it;
``j0, dj`` the parameter columns this thread updates (``range(j0, P, dj)``: 0, 1 for all of them, or a
CUDA row kernel's x-thread and block width). Hyperparameters are Python or NumPy floats, cast to the
rows' dtype inside (:func:`cast_like`), so the arithmetic stays in it. L2: the gradient used is ``g +
l2 * w`` (skipped when ``l2 == 0``). The parameter part of a row is ``w[s, :P]``; the state follows
(layouts in ``_row_optim.py``).

Kernels and device-agnostic functions only: every input is an argument, nothing is read from module
globals (Numba freezes them).
"""

from __future__ import annotations

import math

import numpy as np
from numba.extending import overload

from .._jit import njit


def _both_targets(fn):
    """Make plain Python ``fn`` callable from Numba code on every target (CPU, CUDA) as itself."""
    overload(fn, target="generic", strict=False)(lambda *args: fn)
    return fn


def cast_like(a, x):
    """``x`` in the dtype of array ``a`` (as storing it into ``a`` would round it)."""
    return a.dtype.type(x)


@overload(cast_like, target="generic")
def _cast_like(a, x):
    dt = a.dtype

    def impl(a, x):
        return dt(x)

    return impl


@_both_targets
def l2_grad(w, s, g, i, j, l2):
    """The gradient of parameter column j of row s: ``g[i, j] + l2 * w[s, j]`` (``l2`` of w's dtype)."""
    gj = g[i, j]
    if l2 != 0:
        gj = gj + l2 * w[s, j]
    return gj


@_both_targets
def sgd_row(w, s, g, i, lr, l2, j0, dj):
    """``w -= lr * g``."""
    lr_, l2_ = cast_like(w, lr), cast_like(w, l2)
    for j in range(j0, g.shape[1], dj):
        gj = l2_grad(w, s, g, i, j, l2_)
        w[s, j] -= lr_ * gj


@_both_targets
def adagrad_row(w, s, g, i, lr, eps, l2, state_col, j0, dj):
    """Accumulator of column j at ``state_col + j``: ``acc += g^2; w -= lr * g / (sqrt(acc) + eps)``."""
    lr_, eps_, l2_ = cast_like(w, lr), cast_like(w, eps), cast_like(w, l2)
    for j in range(j0, g.shape[1], dj):
        gj = l2_grad(w, s, g, i, j, l2_)
        a = w[s, state_col + j] + gj * gj
        w[s, state_col + j] = a
        w[s, j] -= lr_ * gj / (math.sqrt(a) + eps_)


@_both_targets
def rowwise_adagrad_row(w, s, g, i, lr, eps, l2):
    """One accumulator per row, column P: ``acc += mean_j(g_j^2)`` (summed in float64, then cast);
    ``w -= lr * g / (sqrt(acc) + eps)``. All columns (the mean needs every one)."""
    lr_, eps_, l2_ = cast_like(w, lr), cast_like(w, eps), cast_like(w, l2)
    P = g.shape[1]
    sq = 0.0
    for j in range(P):
        gj = l2_grad(w, s, g, i, j, l2_)
        sq += np.float64(gj) * np.float64(gj)
    a = w[s, P] + cast_like(w, sq / P)
    w[s, P] = a
    den = math.sqrt(a) + eps_
    for j in range(P):
        gj = l2_grad(w, s, g, i, j, l2_)
        w[s, j] -= lr_ * gj / den


@_both_targets
def adam_row(w, s, g, i, lr, b1, b2, eps, l2):
    """State ``[m (P) | v (P) | t (1)]`` after the parameters; ``t`` is the row's own step count::

        t += 1;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    ``lr``, ``b1``, ``b2`` float64; the bias corrections are computed in float64 and then cast, as
    ``DenseAdam`` does. All columns (the step count is the row's)."""
    P = g.shape[1]
    c1, c2 = cast_like(w, 1.0 - b1), cast_like(w, 1.0 - b2)
    b1_, b2_, eps_, l2_ = cast_like(w, b1), cast_like(w, b2), cast_like(w, eps), cast_like(w, l2)
    t = w[s, 3 * P] + cast_like(w, 1.0)  # exact below 2**24 updates of one key in float32
    w[s, 3 * P] = t
    tf = np.float64(t)
    step = cast_like(w, lr / (1.0 - b1 ** tf))
    bc2 = cast_like(w, math.sqrt(1.0 - b2 ** tf))
    for j in range(P):
        gj = l2_grad(w, s, g, i, j, l2_)
        m = b1_ * w[s, P + j] + c1 * gj
        v = b2_ * w[s, 2 * P + j] + c2 * (gj * gj)
        w[s, P + j] = m
        w[s, 2 * P + j] = v
        w[s, j] -= step * m / (math.sqrt(v) / bc2 + eps_)


# -- CPU kernels: rows (u, W) float32/float64 C-contiguous host arrays, g (u, P) of their dtype ------------
@njit(nogil=True, cache=True)
def sgd_rows(rows, g, lr, l2):
    """:func:`sgd_row` on every row."""
    for i in range(g.shape[0]):
        sgd_row(rows, i, g, i, lr, l2, 0, 1)


@njit(nogil=True, cache=True)
def adagrad_rows(rows, g, lr, eps, l2):
    """:func:`adagrad_row` on every row, accumulators ``rows[:, P:2P]``."""
    for i in range(g.shape[0]):
        adagrad_row(rows, i, g, i, lr, eps, l2, g.shape[1], 0, 1)


@njit(nogil=True, cache=True)
def rowwise_adagrad_rows(rows, g, lr, eps, l2):
    """:func:`rowwise_adagrad_row` on every row, accumulator ``rows[:, P]``."""
    for i in range(g.shape[0]):
        rowwise_adagrad_row(rows, i, g, i, lr, eps, l2)


@njit(nogil=True, cache=True)
def adam_rows(rows, g, lr, b1, b2, eps, l2):
    """:func:`adam_row` on every row."""
    for i in range(g.shape[0]):
        adam_row(rows, i, g, i, lr, b1, b2, eps, l2)
