"""CUDA kernel of the deterministic per-key row initializer: the device twin of
``_init_kernels.init_rows`` (the same bits), so a GPU HBM-PS makes the rows of keys new to every tier
where they live instead of the host drawing and uploading them. Kernels only; launched by
``hps.gpu.init_rows_async``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from .._grid_kernels import row0, row_step
from .._hashing import mix64
from ._init_kernels import draw_bits


@cuda.jit
def init_rows(keys, idx, base, emb_dim, scale, state_value, out):
    """Row kernel over idx (m,) int64: out[r, :emb_dim] = the initial draws of keys[r] for r = idx[i],
    out[r, emb_dim:] = state_value. keys (n,) uint64, out (n, W) float32; ``base`` =
    ``_init_kernels.seed_base(seed)`` (host).

    Column j's draw is ``init_rows``': ``x = draw_bits(mix64(key ^ base), j)`` (53 bits), ``u =
    x * 2**-53`` (exact: x < 2**53), ``v = float32((2u - 1) * scale)`` (``2u - 1`` is exact, so a fused
    multiply-add there changes nothing: one rounding in the product, one in the cast), and ``-scale``
    where float32 rounding reached ``scale``."""
    fs = np.float32(scale)
    for i in range(row0(), idx.shape[0], row_step()):
        r = idx[i]
        h = np.uint64(mix64(keys[r] ^ base))
        for j in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
            if j < emb_dim:
                x = draw_bits(h, j)
                u = np.float64(x) * 1.1102230246251565e-16   # 2**-53
                v = np.float32((2.0 * u - 1.0) * scale)
                if v >= fs:
                    v = -fs
                out[r, j] = v
            else:
                out[r, j] = state_value
