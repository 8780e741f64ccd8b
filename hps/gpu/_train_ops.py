"""GPU-resident training operations: validated public functions over ``_train_kernels``.

Three layers per operation (STYLE.md): the ``@cuda.jit`` kernel (``_train_kernels``), a private
launcher (``_launch_*``: launch shape and stream, nothing else), and the public function here, which
checks the array contract and returns early on empty input.

Every public function is **asynchronous**: it enqueues kernels on ``stream`` and returns at once; it
never allocates, copies between host and device, or synchronises. Outputs are caller-owned device
arrays (allocate them once, e.g. from CuPy's pool). Inputs and outputs are device arrays — CuPy,
Numba, anything with ``__cuda_array_interface__`` (viewed zero-copy, without syncing its stream: order
your streams yourself) — or, under the CUDA simulator, NumPy arrays standing in for them (the seam of
``hps._xp``). A host array on a real GPU is refused rather than silently copied: upload through
:class:`hps.gpu.TransferLedger`. ``stream``: 0 (the default stream), a Numba stream, or a CuPy stream.

Table access is a :class:`hps.table.TableView` from ``with table.device_view() as view:``, which keeps
the table's lock (no purge or growth) while the kernels are enqueued.

One mini-batch (docs/gpu.md, "Per batch"; ``u`` unique keys, ``nnz`` occurrences, ``n`` examples,
``F`` fields, ``P`` parameter columns)::

    find_slots_async(view, keys, slots, scalars.missing)               # slots (u,) int64
    pool_forward_async(view, slots, inv, field, weights, offsets, pooled, width=P)
    ... dense forward/backward on CuPy; bce_loss_grad_async(z, labels, n_total, dz, scalars.loss) ...
    pool_backward_async(grad_pooled, inv, field, weights, offsets, grads)    # per-key sums (u, P)
    ... sparse all-reduce of (keys, grads) across ranks, if any ...
    sparse_update_async(view, slots, grads, optimizer)                 # _row_ops: the row optimizers
    ... once per batch: scalars.read(ledger) -> {"loss": ..., "missing": ...} ...

Not thread-safe per stream: one thread enqueues a mini-batch's work.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _launch as L
from ..errors import InvalidInputError, InvalidTypeError

try:
    from . import _train_kernels as K
except Exception:  # numba-cuda missing or broken: reported when an operation is called (_launch.cuda)
    K = None

__all__ = ["find_slots_async", "pool_forward_async", "pool_forward_rows_async", "pool_backward_async",
           "pool_backward_sorted_async", "backward_plan", "BackwardPlan", "gather_rows_async",
           "bce_loss_grad_async", "BatchScalars"]


# -- device arrays, streams, launch shapes ------------------------------------------------------------
def _require_cuda() -> None:
    L.cuda("GPU training kernels")


def _dev(x, name: str, dtype=None, ndim: int | None = None):
    """A device array the kernels take for ``x`` (zero-copy), after checking dtype and ndim."""
    _require_cuda()
    return L.arg(x, name, dtype, ndim)


def _view(view):
    """(keys, state, values) of a :class:`~hps.table.TableView`, checked to be device arrays (a CPU
    table's view is refused outside the simulator: its arrays would be copied at every launch)."""
    keys = _dev(view.keys, "view.keys", np.uint64, 1)
    state = _dev(view.state, "view.state", np.int32, 1)
    values = _dev(view.values, "view.values", None, 2)
    return keys, state, values


_check_len = L.check_len


def _plan(inv, field, weights, offsets, dtype):
    """Device views of a mini-batch's occurrence arrays, checked: inv (nnz,) int64, field (nnz,) int32,
    weights (nnz,) ``dtype``, offsets (n + 1,) int64. Returns them and n."""
    inv = _dev(inv, "inv", np.int64, 1)
    field = _dev(field, "field", np.int32, 1)
    weights = _dev(weights, "weights", dtype, 1)
    offsets = _dev(offsets, "offsets", np.int64, 1)
    nnz = inv.shape[0]
    _check_len(field, nnz, "field", "one per key occurrence, like inv")
    _check_len(weights, nnz, "weights", "one per key occurrence, like inv")
    if offsets.shape[0] < 1:
        raise InvalidInputError("offsets must have n + 1 >= 1 entries (CSR of the examples)")
    return inv, field, weights, offsets, offsets.shape[0] - 1


# -- private launchers (launch shape and stream only) ----------------------------------------------------
def _launch_pool_forward(tvals, slots, inv, field, weights, offsets, col0, width, out, stream):
    L.launch(K.pool_forward, L.grid_rows(out.shape[0], width), stream, tvals, slots, inv, field, weights,
             offsets, col0, width, out)


def _launch_zero(a, stream):
    if a.ndim == 1:
        L.launch(K.zero_cells, L.grid1(a.shape[0]), stream, a)
    else:
        L.launch(K.zero_rows, L.grid_rows(a.shape[0], a.shape[1]), stream, a)


# -- public functions ----------------------------------------------------------------------------------
def find_slots_async(view, keys, slots, missing, stream=0) -> None:
    """Slots of a mini-batch's unique keys in the table. Asynchronous.

    view: :class:`~hps.table.TableView` of a CUDA table. keys (u,) uint64 device; slots (u,) int64
    device, out: the slot of each live key, -1 for a key that is absent or erased; missing (1,)
    float64 device (``BatchScalars.missing``) += the number of -1s (read it once per batch: a
    non-zero count is a residency bug)."""
    tkeys, tstate, _ = _view(view)
    keys = _dev(keys, "keys", np.uint64, 1)
    slots = _dev(slots, "slots", np.int64, 1)
    missing = _dev(missing, "missing", np.float64, 1)
    _check_len(slots, keys.shape[0], "slots", "one per key")
    if keys.shape[0]:
        L.launch(K.find_slots, L.grid1(keys.shape[0]), stream, tkeys, tstate, keys, slots, missing)


def pool_forward_async(view, slots, inv, field, weights, offsets, out, width: int, col0: int = 0,
                       stream=0) -> None:
    """Pooled embedding lookup from the table (the twin of ``pool_fields``). Asynchronous.

    Columns ``col0 : col0 + width`` of each row are the pooled vector (``col0=0, width=emb_dim`` for
    ``[embedding | state]`` rows; a first-order weight column is ``width=1`` at its column).
    slots (u,) int64 from :func:`find_slots_async`; inv, field, weights (nnz,) and offsets (n + 1,)
    the mini-batch plan (weights of the table dtype); out (n, F * width) of the table dtype, fully
    written: ``out[e, f*width:(f+1)*width]`` sums ``weights[k] * row[col0:col0+width]`` over the
    occurrences k of example e in field f, in CSR order. REQUIRES: 0 <= inv < u, 0 <= field < F."""
    tvals = _view(view)[2]
    dt = tvals.dtype
    slots = _dev(slots, "slots", np.int64, 1)
    inv, field, weights, offsets, n = _plan(inv, field, weights, offsets, dt)
    out = _dev(out, "out", dt, 2)
    width, col0 = int(width), int(col0)
    if width <= 0 or col0 < 0 or col0 + width > tvals.shape[1]:
        raise InvalidInputError(f"need width > 0 and 0 <= col0, col0 + width <= {tvals.shape[1]} (the row "
                                f"width), got col0={col0}, width={width}")
    if out.shape[0] != n or out.shape[1] % width:
        raise InvalidInputError(f"out must be (n={n}, n_fields * {width}), got {tuple(out.shape)}")
    if n and out.shape[1]:
        _launch_pool_forward(tvals, slots, inv, field, weights, offsets, col0, width, out, stream)


def pool_backward_async(grad_pooled, inv, field, weights, offsets, grads, stream=0) -> None:
    """Gradients of the pooled vectors reduced into per-key sums (the twin of
    ``pool_fields_backward``), one fused kernel: the transpose of pooling scatters each occurrence's
    ``weights[k] * grad_pooled[e, field[k]*P:(field[k]+1)*P]`` into ``grads[inv[k]]`` with
    ``cuda.atomic.add`` — the table's accumulate atomics, applied to a (u, P) buffer indexed by the
    plan's unique index rather than to the table, because the sums must be all-reduced across ranks
    before the (non-linear) optimizer step. Asynchronous.

    grad_pooled (n, F * P) float; grads (u, P) of the same dtype, out: zeroed here, then the sums
    (their float addition order is not fixed). REQUIRES: 0 <= inv < u, 0 <= field < F."""
    grad_pooled = _dev(grad_pooled, "grad_pooled", None, 2)
    dt = grad_pooled.dtype
    grads = _dev(grads, "grads", dt, 2)
    inv, field, weights, offsets, n = _plan(inv, field, weights, offsets, dt)
    p = grads.shape[1]
    if grad_pooled.shape[0] != n or p == 0 or grad_pooled.shape[1] % p:
        raise InvalidInputError(f"grad_pooled must be (n={n}, n_fields * {p}) for grads of width {p}, got "
                                f"{tuple(grad_pooled.shape)}")
    if grads.shape[0]:
        _launch_zero(grads, stream)
    if n and inv.shape[0]:
        L.launch(K.pool_backward, L.grid_rows(n, p), stream, grad_pooled, inv, field, weights, offsets, grads)


#: Occurrences of one key a thread of the deterministic backward sums serially (``pool_backward_chunks``);
#: a key with more is summed in chunks of this many, then the chunks in order.
BACKWARD_CHUNK = 64


class BackwardPlan(NamedTuple):
    """A mini-batch's occurrences grouped by key, on the device, for :func:`pool_backward_sorted_async`
    (from :func:`backward_plan`). ``nnz`` occurrences, ``u`` keys, ``c`` chunks (an upper bound; the
    unused ones are empty)."""

    ex: object       #: (nnz,) int64, the example of each occurrence, in key order (CSR order within a key)
    fld: object      #: (nnz,) int32, its field
    wts: object      #: (nnz,) float, its weight
    cstart: object   #: (c,) int64, first position of each chunk (chunks never cross keys)
    cend: object     #: (c,) int64, one past its last
    cptr: object     #: (u + 1,) int64, the chunks of key i are ``cptr[i]:cptr[i + 1]``
    partial: object  #: (c, P) float scratch, the sum of each chunk


def backward_plan(inv, field, weights, offsets, u: int, width: int, xp, chunk: int = BACKWARD_CHUNK):
    """:class:`BackwardPlan` of a mini-batch plan (inv (nnz,) int64, field (nnz,) int32, weights (nnz,)
    float, offsets (n + 1,) int64: device arrays of ``xp``, CuPy, or NumPy under the simulator) with
    ``u`` keys and gradients of ``width`` columns, built with ``xp`` on the device: one sort of
    ``inv * nnz + k`` (distinct values, so any sort keeps CSR order within a key), counts, scans and
    binary searches; nothing is read back. Asynchronous on ``xp``'s current stream; allocates the plan
    (build it where a batch is staged, e.g. the place stage, not inside the mini-batch loop)."""
    nnz, u, chunk = int(inv.shape[0]), int(u), int(chunk)
    if chunk < 1 or u < 0 or width < 1:
        raise InvalidInputError(f"need chunk >= 1, u >= 0 and width >= 1, got {chunk}, {u}, {width}")
    c = u + nnz // chunk if nnz and u else 0  # sum over keys of ceil(count / chunk) is at most this
    if c == 0:
        empty = xp.zeros(0, np.int64)
        return BackwardPlan(empty, xp.zeros(0, np.int32), xp.zeros(0, weights.dtype), empty, empty,
                            xp.zeros(u + 1, np.int64), xp.zeros((0, width), weights.dtype))
    order = xp.sort(inv * nnz + xp.arange(nnz, dtype=np.int64)) % nnz
    kptr, cptr = chunk_pointers(inv, u, chunk, xp)
    ids = xp.arange(c, dtype=np.int64)
    cstart, cend = chunk_bounds(kptr, cptr, ids, chunk, xp)
    used = ids < cptr[u]  # the chunks past the last key's are empty
    cstart, cend = xp.where(used, cstart, 0), xp.where(used, cend, 0)
    ex = xp.searchsorted(offsets[1:], order, side="right").astype(np.int64)
    return BackwardPlan(ex, field[order], weights[order], cstart, cend, cptr, xp.empty((c, width), weights.dtype))


def chunk_pointers(inv, u: int, chunk: int, xp):
    """(kptr, cptr) (u + 1,) int64 of occurrences ``inv`` (nnz,) of u keys: key i's occurrences are
    ``kptr[i]:kptr[i + 1]`` in key order, its chunks of at most ``chunk`` of them ``cptr[i]:cptr[i + 1]``."""
    counts = xp.bincount(inv, minlength=u).astype(np.int64)
    kptr = xp.zeros(u + 1, np.int64)
    kptr[1:] = xp.cumsum(counts)
    cptr = xp.zeros(u + 1, np.int64)
    cptr[1:] = xp.cumsum((counts + chunk - 1) // chunk)
    return kptr, cptr


def chunk_bounds(kptr, cptr, ids, chunk: int, xp):
    """(cstart, cend) int64 of chunks ``ids`` (:func:`chunk_pointers`): each chunk's first position in key
    order and one past its last (chunks never cross keys). An id past the last chunk gets the last
    key's bounds (the caller masks it)."""
    ckey = xp.minimum(xp.searchsorted(cptr[1:], ids, side="right"), cptr.shape[0] - 2)  # key of each chunk
    cstart = kptr[ckey] + (ids - cptr[ckey]) * chunk
    return cstart, xp.minimum(cstart + chunk, kptr[ckey + 1])


def pool_backward_sorted_async(grad_pooled, plan: BackwardPlan, grads, stream=0) -> None:
    """:func:`pool_backward_async` without atomics, the same sums in a fixed order, so a run repeats
    bit for bit (and a key with at most ``BACKWARD_CHUNK`` occurrences sums in ``pool_fields_backward``'s
    order): chunk sums (``pool_backward_chunks``), then each key's chunks in order (``sum_chunks``).
    grad_pooled (n, F * P); plan from :func:`backward_plan` with width P; grads (u, P), fully written.
    Asynchronous."""
    grad_pooled = _dev(grad_pooled, "grad_pooled", None, 2)
    dt = grad_pooled.dtype
    grads = _dev(grads, "grads", dt, 2)
    partial = _dev(plan.partial, "plan.partial", dt, 2)
    cptr = _dev(plan.cptr, "plan.cptr", np.int64, 1)
    u, p = grads.shape
    _check_len(cptr, u + 1, "plan.cptr", "u + 1 for grads of u keys")
    if partial.shape[1] != p or p == 0 or grad_pooled.shape[1] % p:
        raise InvalidInputError(f"grads (u, {p}), the plan's width {partial.shape[1]} and grad_pooled "
                                f"{tuple(grad_pooled.shape)} (n, F * P) do not agree")
    c = partial.shape[0]
    if c:
        L.launch(K.pool_backward_chunks, L.grid_rows(c, p), stream, grad_pooled, _dev(plan.ex, "plan.ex", np.int64, 1),
                 _dev(plan.fld, "plan.fld", np.int32, 1), _dev(plan.wts, "plan.wts", dt, 1),
                 _dev(plan.cstart, "plan.cstart", np.int64, 1), _dev(plan.cend, "plan.cend", np.int64, 1), partial)
    if u:
        L.launch(K.sum_chunks, L.grid_rows(u, p), stream, partial, cptr, grads)


def pool_forward_rows_async(rows, ident, inv, field, weights, offsets, out, stream=0) -> None:
    """:func:`pool_forward_async` over a (u, P) device array of rows instead of a table: ``out`` (n, F * P)
    pools ``rows`` (e.g. the rows of the keys this rank asked of their owners, received over MPI).
    ident (u,) int64 device = ``arange(u)`` (caller-owned). Asynchronous."""
    rows = _dev(rows, "rows", None, 2)
    ident = _dev(ident, "ident", np.int64, 1)
    _check_len(ident, rows.shape[0], "ident", "arange over the rows")
    inv, field, weights, offsets, n = _plan(inv, field, weights, offsets, rows.dtype)
    out = _dev(out, "out", rows.dtype, 2)
    width = rows.shape[1]
    if width == 0 or out.shape[0] != n or out.shape[1] % width:
        raise InvalidInputError(f"out must be (n={n}, n_fields * {width}), got {tuple(out.shape)}")
    if n and out.shape[1]:
        _launch_pool_forward(rows, ident, inv, field, weights, offsets, 0, width, out, stream)


def gather_rows_async(view, slots, idx, out, stream=0) -> None:
    """``out[i] = row[:P]`` of the key in slot ``slots[idx[i]]`` (P = out.shape[1]; zeros for a slot of
    -1): the parameter part of the rows an owner serves, in the order they are asked. slots (u,) int64
    from :func:`find_slots_async`; idx (m,) int64 into slots; out (m, P) of the table dtype.
    Asynchronous."""
    tvals = _view(view)[2]
    slots = _dev(slots, "slots", np.int64, 1)
    idx = _dev(idx, "idx", np.int64, 1)
    out = _dev(out, "out", tvals.dtype, 2)
    _check_len(out, idx.shape[0], "out", "one per index")
    if out.shape[1] > tvals.shape[1]:
        raise InvalidInputError(f"out has {out.shape[1]} columns, more than the row width {tvals.shape[1]}")
    if out.shape[0] and out.shape[1]:
        L.launch(K.gather_rows, L.grid_rows(out.shape[0], out.shape[1]), stream, tvals, slots, idx, out)


def bce_loss_grad_async(z, labels, n_total: int, dz, loss, stream=0) -> None:
    """Loss and logit gradient of a mini-batch share, on the device. z (n,) logits and labels (n,)
    of one float dtype; dz (n,) out = (sigmoid(z) - labels) / n_total (the ``dh`` of
    ``CTRModel.forward_backward``); loss (1,) float64 device (``BatchScalars.loss``) += the sum of
    the share's per-example BCE, so ``loss / examples`` read once per batch is the batch's mean.
    Asynchronous."""
    z = _dev(z, "z", None, 1)
    labels = _dev(labels, "labels", z.dtype, 1)
    dz = _dev(dz, "dz", z.dtype, 1)
    loss = _dev(loss, "loss", np.float64, 1)
    _check_len(labels, z.shape[0], "labels", "one per logit")
    _check_len(dz, z.shape[0], "dz", "one per logit")
    if int(n_total) < max(1, z.shape[0]):
        raise InvalidInputError(f"n_total must be >= the {z.shape[0]} examples and > 0, got {n_total}")
    if z.shape[0]:
        L.launch(K.bce_loss_grad, L.grid1(z.shape[0]), stream, z, labels, z.dtype.type(n_total), dz, loss)


class BatchScalars:
    """Device-side accumulators of one batch, read once at its end (16 bytes through the ledger):
    ``loss`` (float64 sum of per-example BCE, :func:`bce_loss_grad_async`) and ``missing`` (working-set
    keys :func:`find_slots_async` did not find; exact below 2**53).

    ``cells`` (2,) float64 is a Numba device array; :attr:`loss` and :attr:`missing` are (1,) views of
    it to pass to the kernels. Not thread-safe: the train stage owns it.
    """

    NAMES = ("loss", "missing")

    def __init__(self, stream=0):
        self.cells = L.cuda("GPU training kernels").device_array(len(self.NAMES), dtype=np.float64)
        self.zero(stream)

    @property
    def loss(self):
        return self.cells[0:1]

    @property
    def missing(self):
        return self.cells[1:2]

    def zero(self, stream=0) -> None:
        """Reset both accumulators on the device (a kernel, no copy). Asynchronous."""
        _launch_zero(self.cells, stream)

    def add(self, other, stream=0) -> None:
        """Add ``other``'s accumulators into these (a kernel; ``other.cells`` must be on this GPU,
        e.g. a part's scalars after ``Placement.peer``). Asynchronous."""
        cells = _dev(other.cells if isinstance(other, BatchScalars) else other, "other", np.float64, 1)
        _check_len(cells, len(self.NAMES), "other", "one cell per accumulator")
        L.launch(K.add_cells, L.grid1(cells.shape[0]), stream, self.cells, cells)

    def read(self, ledger, stream=0) -> dict:
        """``{"loss": float, "missing": int}``: one 16-byte copy to the host, counted by ``ledger``
        (a :class:`~hps.gpu.TransferLedger`) as ``minibatch`` bytes. Blocks until the values are
        on the host (the copy waits for the work queued before it on ``stream``)."""
        s = L.stream_of(stream)
        host = ledger.to_host(self.cells, "minibatch", stream=s)
        if s != 0:
            s.synchronize()
        return {"loss": float(host[0]), "missing": int(host[1])}
