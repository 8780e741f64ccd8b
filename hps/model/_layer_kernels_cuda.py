"""CUDA kernels of the MLP's elementwise steps (``_layers`` with ``HPS_CUDA_LAYERS=kernel``): a layer's
bias and ReLU in one launch, and the ReLU's backward mask in one, where CuPy takes two operations each
(``y += b`` then ``maximum``; ``y > 0`` then ``dy *= ``). Launched through ``hps._launch``, which holds the
GIL through the driver call (``hps._driver_launch``), where every CuPy launch hands it back.

The same operations as CuPy's, in the same order, so the bits are CuPy's: ``y + b`` then ``0`` where that is
below zero (NaN stays NaN, as ``maximum`` keeps it); ``dy * (y > 0)``. (n, m) C-contiguous
device arrays of one float dtype; each element is written by its own thread only. Kernels only.
"""

from __future__ import annotations

from numba import cuda


@cuda.jit
def bias_act(y, bias, relu, zero):
    """1-D over the n * m elements of y (n, m): ``y += bias`` (m,), then the ReLU when ``relu`` (``zero``: a
    0 of y's dtype, so the arithmetic stays in it)."""
    m = y.shape[1]
    for t in range(cuda.grid(1), y.shape[0] * m, cuda.gridsize(1)):
        i, j = t // m, t % m
        v = y[i, j] + bias[j]
        if relu and v < zero:
            v = zero
        y[i, j] = v


@cuda.jit
def relu_mask(act, dy):
    """1-D over the n * m elements: ``dy *= act > 0`` for a ReLU whose output was ``act`` (n, m)."""
    m = dy.shape[1]
    for t in range(cuda.grid(1), dy.shape[0] * m, cuda.gridsize(1)):
        i, j = t // m, t % m
        dy[i, j] = dy[i, j] * (act[i, j] > 0)   # a boolean factor: the product stays in dy's dtype
