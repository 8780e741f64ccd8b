"""CPU kernels of the models: field pooling and its transpose. (The key-seeded initial rows come
from ``hps/mem/_init_kernels.py``, the one initializer every tier uses.)

Kernels only: every input is an argument, nothing is read from module globals (Numba freezes them).
All are ``@njit(nogil=True, cache=True)`` so pipeline threads run them in parallel. Arrays are host
NumPy, C-contiguous; outputs are written in place and must be zeroed by the caller where noted.

Threads: :func:`pool_fields` writes only the rows of ``out`` of the examples its ``offsets`` cover, so
calls on disjoint example ranges (a model's chunks, ``hps.model._chunks``) run at once on threads;
:func:`pool_fields_backward` adds into whichever unique rows the occurrences name, so two calls must
not share an ``out``.

Notation: ``n`` examples, ``nnz`` key occurrences, ``u`` unique keys, ``F`` fields, ``d`` emb_dim.
"""

from __future__ import annotations

from .._jit import njit



@njit(nogil=True, cache=True)
def pool_fields(emb_rows, inv, field, weights, offsets, out):
    """Weighted sum-pooling per (example, field).

    emb_rows (u, d) float; inv (nnz,) int: unique row of each occurrence; field (nnz,) int in [0, F);
    weights (nnz,) float; offsets (n + 1,) int64 (absolute positions in inv/field/weights, so a chunk of
    examples passes ``offsets[r0:r1 + 1]`` and ``out[r0:r1]``); out (n, F * d) float, ZEROED by the caller.
    ``out[e, f*d:(f+1)*d] = sum_{k in e, field[k] == f} weights[k] * emb_rows[inv[k]]``.

    The column loop runs over two row views (``dst``, ``src``) indexed from 0, so the compiler
    vectorises it (each column still adds its occurrences in CSR order: the same bits); indexing the
    2-D arrays with ``base + j`` kept it scalar (on the shared 2-core VM, 2026-11-28: 4,096 examples
    x 26 fields, d 32, 45 k rows, 25.0 -> 14.3 ms, indicative).
    """
    d = emb_rows.shape[1]
    for e in range(offsets.shape[0] - 1):
        o = out[e]
        for k in range(offsets[e], offsets[e + 1]):
            base = field[k] * d
            dst = o[base:base + d]
            src = emb_rows[inv[k]]
            w = weights[k]
            for j in range(d):
                dst[j] += w * src[j]


@njit(nogil=True, cache=True)
def pool_fields_backward(grad_pooled, inv, field, weights, offsets, out):
    """Transpose of :func:`pool_fields`: scatter-add pooled gradients onto unique rows.

    grad_pooled (n, F * d) float; inv, field, weights, offsets as in :func:`pool_fields`;
    out (u, d) float, ZEROED by the caller.
    ``out[inv[k]] += weights[k] * grad_pooled[e(k), field[k]*d:(field[k]+1)*d]``. Row views as in
    :func:`pool_fields` (vectorised; the same bits: 7.2 -> 4.4 ms on that shape).
    """
    d = out.shape[1]
    for e in range(offsets.shape[0] - 1):
        gp = grad_pooled[e]
        for k in range(offsets[e], offsets[e + 1]):
            base = field[k] * d
            src = gp[base:base + d]
            dst = out[inv[k]]
            w = weights[k]
            for j in range(d):
                dst[j] += w * src[j]
