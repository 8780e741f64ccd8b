"""CPU kernels of the CTR model: field pooling, its transpose, and key-seeded row initialisation.

Kernels only: every input is an argument, nothing is read from module globals (Numba freezes them).
All are ``@njit(nogil=True, cache=True)`` so pipeline threads run them in parallel. Arrays are host
NumPy, C-contiguous; outputs are written in place and must be zeroed by the caller where noted.

Notation: ``n`` examples, ``nnz`` key occurrences, ``u`` unique keys, ``F`` fields, ``d`` emb_dim.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._hashing import mix64


@njit(nogil=True, cache=True)
def pool_fields(emb_rows, inv, field, weights, offsets, out):
    """Weighted sum-pooling per (example, field).

    emb_rows (u, d) float; inv (nnz,) int: unique row of each occurrence; field (nnz,) int in [0, F);
    weights (nnz,) float; offsets (n + 1,) int64; out (n, F * d) float, ZEROED by the caller.
    ``out[e, f*d:(f+1)*d] = sum_{k in e, field[k] == f} weights[k] * emb_rows[inv[k]]``.
    """
    d = emb_rows.shape[1]
    for e in range(offsets.shape[0] - 1):
        for k in range(offsets[e], offsets[e + 1]):
            base = field[k] * d
            r = inv[k]
            w = weights[k]
            for j in range(d):
                out[e, base + j] += w * emb_rows[r, j]


@njit(nogil=True, cache=True)
def pool_fields_backward(grad_pooled, inv, field, weights, offsets, out):
    """Transpose of :func:`pool_fields`: scatter-add pooled gradients onto unique rows.

    grad_pooled (n, F * d) float; inv, field, weights, offsets as in :func:`pool_fields`;
    out (u, d) float, ZEROED by the caller.
    ``out[inv[k]] += weights[k] * grad_pooled[e(k), field[k]*d:(field[k]+1)*d]``.
    """
    d = out.shape[1]
    for e in range(offsets.shape[0] - 1):
        for k in range(offsets[e], offsets[e + 1]):
            base = field[k] * d
            r = inv[k]
            w = weights[k]
            for j in range(d):
                out[r, j] += w * grad_pooled[e, base + j]


@njit(nogil=True, cache=True)
def init_embeddings(keys, seed, scale, out):
    """Key-seeded uniform initialisation: ``out[i, j] ~ U(-scale, scale)`` from (keys[i], seed, j) only.

    keys (m,) uint64; seed uint64; scale float; out (m, d) float (fully written).
    Element j of a key's vector is ``mix64(mix64(key ^ mix64(seed)) + j)`` mapped to [0, 1) by its
    top 53 bits, so a row is born identical on every rank, in every tier, in any order.
    """
    d = out.shape[1]
    s = mix64(np.uint64(seed) ^ np.uint64(0x2545F4914F6CDD1D))
    inv53 = 1.0 / 9007199254740992.0  # 2**-53
    for i in range(keys.shape[0]):
        h = mix64(keys[i] ^ s)
        for j in range(d):
            x = mix64(h + np.uint64(j))
            u = np.float64(x >> np.uint64(11)) * inv53
            out[i, j] = (2.0 * u - 1.0) * scale
