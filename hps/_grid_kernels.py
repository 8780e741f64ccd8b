"""Device functions of the grid-stride loops every hps CUDA kernel runs (launch shapes: ``hps._launch``).

A "row" kernel takes a 2-D block ``(bx, by)``: ``threadIdx.y`` picks one of ``by`` items of the block
per round and ``threadIdx.x`` strides over the item's columns; its items are
``range(row0(), n, row_step())``. (A "1-D" kernel's are ``range(cuda.grid(1), n, cuda.gridsize(1))``.)
Device functions only; no state.
"""

from __future__ import annotations

from numba import cuda


@cuda.jit(device=True)
def row0():
    """First item of this thread's row of a row kernel."""
    return cuda.blockIdx.x * cuda.blockDim.y + cuda.threadIdx.y


@cuda.jit(device=True)
def row_step():
    """Items a row kernel's grid covers per round."""
    return cuda.gridDim.x * cuda.blockDim.y
