"""CUDA kernels of GPU-resident training: rows stay in the HBM-PS table (docs/gpu.md).

Kernels and device functions only (no state, no I/O; every constant is an argument or a literal).
The table arrays come from :meth:`hps.HashTable.device_view` (layout in ``hps/table/_cpu_kernels.py``):
``tkeys`` (S,) uint64, ``tstate`` (S,) int32, ``tvals`` (S, W) float. A row is laid out as
``[parameters (P) | optimizer state (Q) | ...]`` (``hps/model/_row_optim.py``); kernels take the column
ranges they touch as arguments (``col0``, ``width``, ``state_col``, the gradient's width P), never a
fixed embedding width, so a first-order weight column or another state layout needs no new kernel.

The plan of a mini-batch (built on the host, uploaded once per batch): ``keys`` (u,) uint64 unique
keys, ``inv`` (nnz,) int64 the unique index of each key occurrence, ``field`` (nnz,) int32,
``weights`` (nnz,) float, ``offsets`` (n + 1,) int64 CSR of the n examples (``hps.data.Batch``).

The row optimizers' kernels, which update table rows in place, live with their math in
``hps/model/_optim_kernels_cuda.py``. CPU twins, which the tests hold these to: ``pool_forward`` / ``pool_backward`` /
``pool_backward_chunks`` + ``sum_chunks`` = ``pool_fields`` / ``pool_fields_backward``
(``hps/model/_kernels.py``); ``bce_loss_grad`` = the loss and logit gradient of ``CTRModel.forward_backward``.

Launch shapes (``hps._launch``; as in ``hps/table/_cuda_kernels.py``): every kernel loops grid-stride.
"1-D" kernels take one thread per item per round; "row" kernels take a 2-D block ``(bx, by)``:
``threadIdx.y`` picks one of ``by`` items (examples or unique keys) of the block per round,
``threadIdx.x`` strides over columns, so a warp touches consecutive columns (coalesced).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .._hashing import mix64
from .._grid_kernels import row0 as _row0
from .._grid_kernels import row_step as _row_step
from ..table._cuda_kernels import _find


@cuda.jit
def find_slots(tkeys, tstate, keys, slots, missing):
    """1-D. slots (u,) int64 = the slot of each live key of keys (u,) uint64, -1 where the key is
    absent or a tombstone; missing (1,) float64 += the number of such keys."""
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        s = _find(tkeys, keys[i])
        if s >= 0 and tstate[s] == 0:
            slots[i] = s
        else:
            slots[i] = np.int64(-1)
            cuda.atomic.add(missing, 0, 1.0)


@cuda.jit
def pool_forward(tvals, slots, inv, field, weights, offsets, col0, width, out):
    """Row kernel over the n examples: weighted sum-pooling per (example, field), straight from the
    table rows. out (n, F * width) float, every element written::

        out[e, f*width + j] = sum over k in e with field[k] == f of
                              weights[k] * tvals[slots[inv[k]], col0 + j]

    Occurrences add in CSR order (the order of ``pool_fields``); one x-thread owns a column of every
    field, so no atomics. A key whose slot is -1 adds nothing (``find_slots`` counted it)."""
    n_fields = out.shape[1] // width
    for e in range(_row0(), out.shape[0], _row_step()):
        for f in range(n_fields):
            for j in range(cuda.threadIdx.x, width, cuda.blockDim.x):
                out[e, f * width + j] = 0
        for k in range(offsets[e], offsets[e + 1]):
            s = slots[inv[k]]
            if s < 0:
                continue
            base = field[k] * width
            wk = weights[k]
            for j in range(cuda.threadIdx.x, width, cuda.blockDim.x):
                out[e, base + j] += wk * tvals[s, col0 + j]


@cuda.jit
def pool_backward(grad_pooled, inv, field, weights, offsets, grads):
    """Row kernel over the n examples, the transpose of ``pool_forward`` fused with the reduction of
    gradients into per-key sums: ``grads[inv[k], j] += weights[k] * grad_pooled[e, field[k]*P + j]``
    for every occurrence k (example e), with ``cuda.atomic.add`` (the atomics of the table's
    ``accumulate``) since occurrences of one key meet from many examples. grad_pooled (n, F * P);
    grads (u, P), ZEROED by the caller. The order of the additions is not fixed (float sums may
    differ from ``pool_fields_backward`` in the last bits, and from run to run)."""
    p = grads.shape[1]
    for e in range(_row0(), grad_pooled.shape[0], _row_step()):
        for k in range(offsets[e], offsets[e + 1]):
            r = inv[k]
            base = field[k] * p
            wk = weights[k]
            for j in range(cuda.threadIdx.x, p, cuda.blockDim.x):
                cuda.atomic.add(grads, (r, j), wk * grad_pooled[e, base + j])


@cuda.jit
def pool_backward_chunks(grad_pooled, ex, fld, wts, cstart, cend, partial):
    """Row kernel over the c chunks of a :class:`~hps.gpu.BackwardPlan`, the deterministic transpose of
    pooling: ``partial[c, j]`` = the sum, from 0 in the plan's order (each key's occurrences in CSR
    order, the order of ``pool_fields_backward``), of ``wts[t] * grad_pooled[ex[t], fld[t]*P + j]``
    over t in ``[cstart[c], cend[c])``. ex, fld, wts (nnz,) the example, field and weight of each
    occurrence in the plan's order; partial (c, P), every element written. No atomics: one x-thread
    owns a column of a chunk."""
    p = partial.shape[1]
    for c in range(_row0(), partial.shape[0], _row_step()):
        for j in range(cuda.threadIdx.x, p, cuda.blockDim.x):
            acc = partial.dtype.type(0)
            for t in range(cstart[c], cend[c]):
                acc += wts[t] * grad_pooled[ex[t], fld[t] * p + j]
            partial[c, j] = acc


@cuda.jit
def sum_chunks(partial, cptr, grads):
    """Row kernel over the u keys: ``grads[i, j]`` = the sum, from 0 in chunk order, of ``partial[c,
    j]`` over key i's chunks ``[cptr[i], cptr[i + 1])`` (one chunk: its partial exactly). Every
    element written (zeros for a key without occurrences)."""
    for i in range(_row0(), grads.shape[0], _row_step()):
        for j in range(cuda.threadIdx.x, grads.shape[1], cuda.blockDim.x):
            acc = grads.dtype.type(0)
            for c in range(cptr[i], cptr[i + 1]):
                acc += partial[c, j]
            grads[i, j] = acc


@cuda.jit
def gather_rows(tvals, slots, idx, out):
    """Row kernel over the m items: ``out[i, :] = tvals[slots[idx[i]], :P]`` with P = out.shape[1]
    (the parameter part of each asked row, e.g. rows an owner serves to other ranks); zeros where the
    slot is -1."""
    for i in range(_row0(), out.shape[0], _row_step()):
        s = slots[idx[i]]
        for j in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
            if s >= 0:
                out[i, j] = tvals[s, j]
            else:
                out[i, j] = 0


@cuda.jit
def bce_loss_grad(z, labels, denom, dz, loss):
    """1-D over the n examples. dz (n,) = (sigmoid(z) - labels) / denom in z's dtype (as ``_sigmoid``
    computes it): the gradient of ``sum(bce) / denom`` w.r.t. the logits z (n,). loss (1,) float64 +=
    the sum of the per-example binary cross-entropy ``max(z, 0) - y z + log1p(exp(-|z|))``, computed
    in float64, summed per thread over its rounds and per block in shared memory (one global atomic
    per block). REQUIRES: a 1-D block, and every thread of the block runs (no early return)."""
    sh = cuda.shared.array(1, dtype=np.float64)
    t = cuda.threadIdx.x
    if t == 0:
        sh[0] = 0.0
    cuda.syncthreads()
    mine = 0.0
    one = z.dtype.type(1)  # a literal 1 would promote float32 arithmetic to float64
    for i in range(cuda.grid(1), z.shape[0], cuda.gridsize(1)):
        zi = z[i]
        yi = labels[i]
        ez = math.exp(-abs(zi))
        p = one / (one + ez) if zi >= 0 else ez / (one + ez)
        dz[i] = (p - yi) / denom
        zd = np.float64(zi)
        mine += max(zd, 0.0) - np.float64(yi) * zd + math.log1p(math.exp(-abs(zd)))
    if mine != 0.0:
        cuda.atomic.add(sh, 0, mine)
    cuda.syncthreads()
    if t == 0 and sh[0] != 0.0:
        cuda.atomic.add(loss, 0, sh[0])


@cuda.jit
def zero_rows(out):
    """Row kernel. out (m, c) = 0."""
    for i in range(_row0(), out.shape[0], _row_step()):
        for j in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
            out[i, j] = 0


@cuda.jit
def zero_cells(cells):
    """1-D. cells (m,) = 0."""
    for i in range(cuda.grid(1), cells.shape[0], cuda.gridsize(1)):
        cells[i] = 0


@cuda.jit
def add_cells(cells, src):
    """1-D. cells (m,) += src (m,) (per-GPU accumulators summed on the main GPU)."""
    for i in range(cuda.grid(1), cells.shape[0], cuda.gridsize(1)):
        cells[i] += src[i]


@cuda.jit
def part_of(keys, salt, n_parts, parts, counts):
    """1-D over the m keys, Algorithm 2's partition policy on the device (the twin of
    ``hps._hashing.owner_of``): parts (m,) int32 = ``mix64(keys[i] ^ salt) % n_parts``; counts
    (n_parts,) int64 += the keys of each part (``cuda.atomic.add``; zeroed by the caller)."""
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        p = np.int32(mix64(keys[i] ^ salt) % np.uint64(n_parts))
        parts[i] = p
        cuda.atomic.add(counts, p, 1)
