"""CPU kernels of the row optimizers: one pass over the rows, updated in place.

Kernels only: every input is an argument, nothing is read from module globals (Numba freezes them).
All are ``@njit(nogil=True, cache=True)``. Arrays are host NumPy: ``rows`` (u, W) float32 or
float64, C-contiguous, ``g`` (u, P) of the rows' dtype with ``P <= W``; scalars are Python floats,
cast to the rows' dtype inside (so the arithmetic stays in it, as the vectorised path's does).
The parameter part is ``rows[:, :P]``; the optimizer state follows it (layouts in ``_row_optim.py``).
L2: the gradient used is ``g + l2 * w`` (skipped when ``l2 == 0``).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def sgd_rows(rows, g, lr, l2):
    """``w -= lr * g``."""
    lr_, l2_ = _cast(rows, lr), _cast(rows, l2)
    for i in range(g.shape[0]):
        for j in range(g.shape[1]):
            gj = g[i, j]
            if l2_ != 0:
                gj = gj + l2_ * rows[i, j]
            rows[i, j] -= lr_ * gj


@njit(nogil=True, cache=True)
def adagrad_rows(rows, g, lr, eps, l2):
    """State ``acc`` = ``rows[:, P:2P]``: ``acc += g^2; w -= lr * g / (sqrt(acc) + eps)``."""
    lr_, eps_, l2_ = _cast(rows, lr), _cast(rows, eps), _cast(rows, l2)
    P = g.shape[1]
    for i in range(g.shape[0]):
        for j in range(P):
            gj = g[i, j]
            if l2_ != 0:
                gj = gj + l2_ * rows[i, j]
            a = rows[i, P + j] + gj * gj
            rows[i, P + j] = a
            rows[i, j] -= lr_ * gj / (np.sqrt(a) + eps_)


@njit(nogil=True, cache=True)
def rowwise_adagrad_rows(rows, g, lr, eps, l2):
    """State ``acc`` = ``rows[:, P]`` (one per row): ``acc += mean_j(g_j^2);
    w -= lr * g / (sqrt(acc) + eps)``. The mean is summed in float64."""
    lr_, eps_, l2_ = _cast(rows, lr), _cast(rows, eps), _cast(rows, l2)
    P = g.shape[1]
    for i in range(g.shape[0]):
        s = 0.0
        for j in range(P):
            gj = g[i, j]
            if l2_ != 0:
                gj = gj + l2_ * rows[i, j]
            s += np.float64(gj) * np.float64(gj)
        a = rows[i, P] + _cast(rows, s / P)
        rows[i, P] = a
        den = np.sqrt(a) + eps_
        for j in range(P):
            gj = g[i, j]
            if l2_ != 0:
                gj = gj + l2_ * rows[i, j]
            rows[i, j] -= lr_ * gj / den


@njit(nogil=True, cache=True)
def _cast(rows, x):
    """``x`` (float64) in the dtype of ``rows``."""
    out = np.empty(1, rows.dtype)
    out[0] = x
    return out[0]


@njit(nogil=True, cache=True)
def adam_rows(rows, g, lr, b1, b2, eps, l2):
    """State ``[m (P) | v (P) | t (1)]`` after the parameters; ``t`` is the row's own step count::

        t += 1;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

    The bias corrections are computed in float64 and then cast, as ``DenseAdam`` does."""
    P = g.shape[1]
    c1, c2 = _cast(rows, 1.0 - b1), _cast(rows, 1.0 - b2)
    b1_, b2_, eps_, l2_ = _cast(rows, b1), _cast(rows, b2), _cast(rows, eps), _cast(rows, l2)
    for i in range(g.shape[0]):
        t = rows[i, 3 * P] + 1
        rows[i, 3 * P] = t
        tf = np.float64(t)
        step = _cast(rows, lr / (1.0 - b1 ** tf))
        bc2 = _cast(rows, np.sqrt(1.0 - b2 ** tf))
        for j in range(P):
            gj = g[i, j]
            if l2_ != 0:
                gj = gj + l2_ * rows[i, j]
            m = b1_ * rows[i, P + j] + c1 * gj
            v = b2_ * rows[i, 2 * P + j] + c2 * (gj * gj)
            rows[i, P + j] = m
            rows[i, 2 * P + j] = v
            rows[i, j] -= step * m / (np.sqrt(v) / bc2 + eps_)
