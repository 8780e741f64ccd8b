"""Every mini-batch's plan of a batch in one pass over the batch: the distinct keys and inverse of each
mini-batch (``unique_inverse``'s) and the order of its gradient sums (``backward_plan``'s), computed with
a constant number of array operations per batch instead of per mini-batch.

Why: a real H200 (2026-11-27, ``bench/results/gpu-h200-2026-11-27``) spent 7.1 s of the place stage on
the 488 mini-batches of a 2 M-example job, ~40 CuPy calls and two sorts each, every call a Python
dispatch and a kernel launch on a few thousand keys. Here the batch's keys are sorted once by
(mini-batch, key, position); a mini-batch's plan is slices of the batch's arrays, rebased.

How the segments stay apart: each key occurrence carries its mini-batch ``seg``; heads of key groups
start where the key or the mini-batch changes, so equal keys of two mini-batches are two groups. The
groups, ranked by first occurrence, are segment-major (mini-batches are contiguous ranges of
positions): a mini-batch's distinct keys are one contiguous range ``uoff[j]:uoff[j + 1]`` of the
batch's, in first-occurrence order, and its inverse is the batch's minus ``uoff[j]``. Its gradient
chunks are likewise the range ``coff[j]:coff[j + 1]``. Those 2 (P + 1) offsets are the one read back
(``read``, counted by the caller's ledger): CuPy needs the sizes on the host.

Exactly the per-mini-batch functions' results (tested against them): the same keys, inverse, and the
same chunks in the same order (the per-mini-batch plan also allocates ``u + nnz // chunk`` chunk rows,
its unused tail empty; here each mini-batch has exactly its chunks).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from ._train_ops import BACKWARD_CHUNK, BackwardPlan, chunk_bounds, chunk_pointers

__all__ = ["minibatch_plans"]


def minibatch_plans(keys, field, weights, offsets, bounds, host_offsets, width: int, xp, read,
                    chunk: int = BACKWARD_CHUNK) -> list:
    """[(ukeys (u_j,) uint64, inv (nnz_j,) int64, BackwardPlan)] of every mini-batch j of a batch.

    ``keys``, ``field``, ``weights`` (nnz,) and ``offsets`` (n + 1,) are the batch's arrays on the device
    (``xp`` arrays); ``bounds`` (P + 1,) the mini-batches' example bounds (host, from 0 to n);
    ``host_offsets`` the host's copy of ``offsets``; ``width`` the gradient columns; ``read(dev)`` returns
    a host copy of a small device array (the caller's ledger counts it). Asynchronous on ``xp``'s
    current stream but for two size reads (CuPy's count of the distinct keys, and ``read``)."""
    bounds = [int(b) for b in bounds]
    p = len(bounds) - 1
    if p < 1 or bounds[0] != 0 or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise InvalidInputError(f"bounds must rise from 0 over at least one mini-batch, got {bounds}")
    kb = [int(host_offsets[b]) for b in bounds]
    n = kb[-1]
    if kb[0] != 0 or n > keys.shape[0]:
        raise InvalidInputError(f"offsets must start at 0 and end within the {keys.shape[0]} keys, got {kb}")
    if n == 0:
        return [_empty(keys, weights, width, xp) for _ in range(p)]
    keys = keys[:n]
    seg = xp.empty(n, np.int32)
    for j in range(p):
        seg[kb[j]:kb[j + 1]] = j
    # sort by (seg, key, position): a stable sort by key, then a stable one by segment
    order = xp.argsort(keys, kind="stable")
    order = order[xp.argsort(seg[order], kind="stable")]
    sk, ss = keys[order], seg[order]
    head = xp.empty(n, np.bool_)
    head[0] = True
    head[1:] = (sk[1:] != sk[:-1]) | (ss[1:] != ss[:-1])
    group = xp.cumsum(head) - 1
    hpos = xp.flatnonzero(head)                       # CuPy reads the group count here
    u = int(hpos.shape[0])
    rank = xp.argsort(order[hpos])                    # groups by first occurrence: segment-major
    where = xp.empty(u, np.int64)
    where[rank] = xp.arange(u, dtype=np.int64)
    g = xp.empty(n, np.int64)
    g[order] = where[group]                           # the batch-wide index of every key's group
    ukeys = sk[hpos][rank]
    uoff = xp.zeros(p + 1, np.int64)
    uoff[1:] = xp.cumsum(xp.bincount(ss[hpos][rank], minlength=p))
    # gradient chunks (backward_plan's, over the batch-wide groups: a group never spans mini-batches)
    kptr, cptr = chunk_pointers(g, u, chunk, xp)
    host = np.asarray(read(xp.concatenate([uoff, cptr[uoff]])), dtype=np.int64)
    uo, co = host[:p + 1].tolist(), host[p + 1:].tolist()
    c = co[-1]
    cstart, cend = chunk_bounds(kptr, cptr, xp.arange(c, dtype=np.int64), chunk, xp)
    border = xp.sort(g * n + xp.arange(n, dtype=np.int64)) % n   # positions by (group, position)
    ex = xp.searchsorted(offsets[1:bounds[-1] + 1], border, side="right").astype(np.int64)
    fld, wts = field[border], weights[border]
    partial = xp.empty((c, width), weights.dtype)
    out = []
    for j in range(p):
        a, ka, kb_ = bounds[j], kb[j], kb[j + 1]
        u0, u1, c0, c1 = uo[j], uo[j + 1], co[j], co[j + 1]
        plan = BackwardPlan(ex[ka:kb_] - a, fld[ka:kb_], wts[ka:kb_], cstart[c0:c1] - ka, cend[c0:c1] - ka,
                            cptr[u0:u1 + 1] - c0, partial[c0:c1])
        out.append((ukeys[u0:u1], g[ka:kb_] - u0, plan))
    return out


def _empty(keys, weights, width: int, xp):
    """A mini-batch without keys: no distinct keys, no occurrences, no chunks."""
    e = xp.zeros(0, np.int64)
    return keys[:0].copy(), e, BackwardPlan(e, xp.zeros(0, np.int32), xp.zeros(0, weights.dtype), e, e,
                                            xp.zeros(1, np.int64), xp.zeros((0, width), weights.dtype))
