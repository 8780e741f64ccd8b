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
(``read``, counted by the caller's ledger): CuPy needs the sizes on the host. The mini-batch bounds go
up (``upload``, 8 (P + 1) bytes): every key's mini-batch comes from them in one search, and every
mini-batch's arrays are rebased at once, so what is left per mini-batch is slicing (the place stage
spent ~10 ms of Python a batch of 16 mini-batches on a per-mini-batch loop of fills and subtractions,
``bench/results/gpu-h200-2026-11-28``, holding the GIL the train thread waits for).

Exactly the per-mini-batch functions' results (tested against them): the same keys, inverse, and the
same chunks in the same order (the per-mini-batch plan also allocates ``u + nnz // chunk`` chunk rows,
its unused tail empty; here each mini-batch has exactly its chunks).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from ._train_ops import BACKWARD_CHUNK, BackwardPlan, chunk_bounds, chunk_pointers

__all__ = ["minibatch_plans"]


def minibatch_plans(keys, field, weights, offsets, bounds, host_offsets, width: int, xp, read, upload,
                    chunk: int = BACKWARD_CHUNK) -> list:
    """[(ukeys (u_j,) uint64, inv (nnz_j,) int64, offsets (n_j + 1,) int64, BackwardPlan)] of every
    mini-batch j of a batch: its distinct keys, inverse, offsets from 0 and gradient order.

    ``keys``, ``field``, ``weights`` (nnz,) and ``offsets`` (n + 1,) are the batch's arrays on the device
    (``xp`` arrays); ``bounds`` (P + 1,) the mini-batches' example bounds (host, from 0 to n);
    ``host_offsets`` the host's copy of ``offsets``; ``width`` the gradient columns; ``read(dev)`` returns
    a host copy of a small device array and ``upload(host)`` a device copy of a small host one (the
    caller's ledger counts both: the bounds go up, 8 (P + 1) bytes). Asynchronous on ``xp``'s current
    stream but for two size reads (CuPy's count of the distinct keys, and ``read``). Every array
    operation is one per batch; what is per mini-batch is slicing."""
    bounds = [int(b) for b in bounds]
    p = len(bounds) - 1
    if p < 1 or bounds[0] != 0 or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise InvalidInputError(f"bounds must rise from 0 over at least one mini-batch, got {bounds}")
    kb = [int(host_offsets[b]) for b in bounds]
    n = kb[-1]
    if kb[0] != 0 or n > keys.shape[0]:
        raise InvalidInputError(f"offsets must start at 0 and end within the {keys.shape[0]} keys, got {kb}")
    offsets = offsets[:bounds[-1] + 1]
    if n == 0:
        return [_empty(keys, weights, offsets[a:b + 1], width, xp) for a, b in zip(bounds, bounds[1:])]
    keys = keys[:n]
    bd = upload(np.asarray(bounds, np.int64))
    kbd = offsets[bd]                                 # the mini-batches' key bounds
    seg = xp.searchsorted(kbd[1:], xp.arange(n, dtype=np.int64), side="right")  # each key's mini-batch
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
    gseg = ss[hpos][rank]                             # each group's mini-batch
    uoff = xp.zeros(p + 1, np.int64)
    uoff[1:] = xp.cumsum(xp.bincount(gseg, minlength=p))
    # gradient chunks (backward_plan's, over the batch-wide groups: a group never spans mini-batches)
    kptr, cptr = chunk_pointers(g, u, chunk, xp)
    host = np.asarray(read(xp.concatenate([uoff, cptr[uoff]])), dtype=np.int64)
    uo, co = host[:p + 1].tolist(), host[p + 1:].tolist()
    c = co[-1]
    cstart, cend = chunk_bounds(kptr, cptr, xp.arange(c, dtype=np.int64), chunk, xp)
    border = xp.sort(g * n + xp.arange(n, dtype=np.int64)) % n   # positions by (group, position)
    ex = xp.searchsorted(offsets[1:], border, side="right").astype(np.int64)
    fld, wts = field[border], weights[border]
    partial = xp.empty((c, width), weights.dtype)
    # rebased to each mini-batch, all at once: the keys of mini-batch j fill positions kb[j]:kb[j + 1] in
    # both orders (groups are segment-major), so position i's mini-batch is seg[i]; a chunk's is its start's
    ex -= bd[seg]
    g -= uoff[seg]
    cbase = kbd[seg[cstart]]
    cstart -= cbase
    cend -= cbase
    ptrs = _segment_pointers(cptr, uoff, gseg, xp)
    offs = _segment_pointers(offsets, bd, xp.searchsorted(bd[1:], xp.arange(bounds[-1], dtype=np.int64),
                                                          side="right"), xp)
    out = []
    for j in range(p):
        a, b, ka, kb_ = bounds[j], bounds[j + 1], kb[j], kb[j + 1]
        u0, u1, c0, c1 = uo[j], uo[j + 1], co[j], co[j + 1]
        plan = BackwardPlan(ex[ka:kb_], fld[ka:kb_], wts[ka:kb_], cstart[c0:c1], cend[c0:c1],
                            ptrs[u0 + j:u1 + j + 1], partial[c0:c1])
        out.append((ukeys[u0:u1], g[ka:kb_], offs[a + j:b + j + 1], plan))
    return out


def _segment_pointers(ptr, starts, seg, xp):
    """Pointers ``ptr`` (m + 1,) cut at ``starts`` (P + 1,) from 0 to m into P segments, each rebased to 0:
    segment j's ``ptr[s_j:s_(j+1) + 1] - ptr[s_j]`` at ``[s_j + j:s_(j+1) + j + 1]`` of the (m + P,)
    result (neighbours share no entry: each has its own end). ``seg`` (m,): the segment of each entry
    ``ptr[:m]`` (where ``starts`` repeats, the last segment starting there)."""
    p, m = starts.shape[0] - 1, ptr.shape[0] - 1
    base = ptr[starts]
    out = xp.empty(m + p, np.int64)
    out[xp.arange(m, dtype=np.int64) + seg] = ptr[:m] - base[seg]
    out[starts[1:] + xp.arange(p, dtype=np.int64)] = base[1:] - base[:-1]
    return out


def _empty(keys, weights, offsets, width: int, xp):
    """A mini-batch without keys: no distinct keys, no occurrences, no chunks; its (examples + 1) offsets
    are zeros."""
    e = xp.zeros(0, np.int64)
    return (keys[:0].copy(), e, xp.zeros(offsets.shape[0], np.int64),
            BackwardPlan(e, xp.zeros(0, np.int32), xp.zeros(0, weights.dtype), e, e, xp.zeros(1, np.int64),
                         xp.zeros((0, width), weights.dtype)))
