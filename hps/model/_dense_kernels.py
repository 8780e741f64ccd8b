"""CPU kernels of the dense optimizers (``_dense_optim``): one pass over a tensor's elements instead of one
NumPy pass per operation of the formula.

Each kernel takes flat (n,) C-contiguous host arrays of one float dtype (the parameter, its gradient, its
state, updated in place) and the hyperparameters as Python floats, cast to the arrays' dtype inside
(``_optim_kernels.cast_like``), and computes every element in the order of the host's NumPy expressions,
one rounding per operation (no ``fastmath``: no fused multiply-add, no reassociation): the bits are those
of the NumPy steps (tests/test_model_optim.py). ``error_model="numpy"``: a division by zero gives inf or
NaN as NumPy's does (Python's error model would raise, and its check per element keeps the loop from
being vectorised: ~8x slower). Kernels only: every input is an argument.
"""

from __future__ import annotations

import math

from .._jit import njit
from ._optim_kernels import cast_like


@njit(nogil=True, cache=True, inline="always")
def adam_step(p, g, m, v, b1, c1, b2, c2, step_size, bc2_sqrt, eps):
    """One element of :func:`adam_flat` -> its new (p, m, v); the hyperparameters already in the
    element's dtype. Inlined into the CPU loop and the CUDA kernel (``_dense_kernels_cuda``) alike."""
    m = m * b1 + g * c1
    v = v * b2 + (g * g) * c2
    return p - (m * step_size) / (math.sqrt(v) / bc2_sqrt + eps), m, v


@njit(nogil=True, cache=True, inline="always")
def adagrad_step(p, g, acc, lr, eps):
    """One element of :func:`adagrad_flat` -> its new (p, acc)."""
    acc = acc + g * g
    return p - (g * lr) / (math.sqrt(acc) + eps), acc


@njit(nogil=True, cache=True, error_model="numpy")
def adam_flat(p, g, m, v, b1, c1, b2, c2, step_size, bc2_sqrt, eps):
    """``m = b1 m + c1 g;  v = b2 v + c2 (g g);  p -= step_size m / (sqrt(v) / bc2_sqrt + eps)``
    (``c1 = 1 - b1``, ``c2 = 1 - b2``), element by element."""
    b1_, c1_, b2_, c2_ = cast_like(p, b1), cast_like(p, c1), cast_like(p, b2), cast_like(p, c2)
    s_, bc_, eps_ = cast_like(p, step_size), cast_like(p, bc2_sqrt), cast_like(p, eps)
    for i in range(p.shape[0]):
        p[i], m[i], v[i] = adam_step(p[i], g[i], m[i], v[i], b1_, c1_, b2_, c2_, s_, bc_, eps_)


@njit(nogil=True, cache=True, error_model="numpy")
def adagrad_flat(p, g, acc, lr, eps):
    """``acc += g g;  p -= lr g / (sqrt(acc) + eps)``, element by element."""
    lr_, eps_ = cast_like(p, lr), cast_like(p, eps)
    for i in range(p.shape[0]):
        p[i], acc[i] = adagrad_step(p[i], g[i], acc[i], lr_, eps_)
