"""All-reduces whose sums have a fixed order one process can mirror: every value is ``0 + x_0 + x_1 + …
+ x_{p-1}``, added in float32 in rank order (DESIGN.md, "Reductions have a fixed order").

MPI's ``Allreduce`` picks its own association (recursive doubling, Rabenseifner, …, by message size
and rank count), and a tree schedule (``_schedule``) fixes one that depends on the topology; neither
can be reproduced by one process reading the same shards. Over hundreds of Adam steps the last-bit
differences grow to 1e-2 (Adam divides by the gradient's own scale). Here the order is the rank order:

- :func:`ordered_allreduce` (dense): a reduce-scatter — rank ``r`` receives chunk ``r`` of every rank's
  vector (one alltoall) and folds them in rank order (``sum_rows_f32``) — then an allgather of the
  folded chunks. The same bytes as a ring all-reduce, ``2 (p - 1) / p`` of the vector per rank, in two
  collectives instead of ``2 (p - 1)`` steps. Element-wise sums do not depend on the chunking, so one
  process folds its shards' whole vectors in shard order (``fold``) and gets the same bits.
- :func:`ordered_sparse_allreduce` (rows of unique keys): each key's rows go to the key's owner rank
  (one alltoallv, records of key + row), which folds them in rank order (``segment_sum``), and every
  owner's sums go to every rank (one allgatherv).

:class:`BlockExchange` carries a (p, w) float32 block per rank inside a sparse alltoallv of rows (the
train step's fused protocol: the dense reduce-scatter rides in the sparse gradients' exchange, the
allgather of the stepped blocks in the next mini-batch's rows exchange); the receiver folds with
:func:`fold_parts`, so the bits are those of the separate collectives.

:func:`start_reduce_scatter` starts the dense reduce-scatter without waiting (MPI's ``Ialltoall``), so
a caller overlaps it with other work (the train step: the sparse gradients' exchange and the owners'
updates, Li et al., "PyTorch Distributed", VLDB 2020, §3.2.3) and folds on :meth:`PendingReduceScatter.wait`;
the fold is the same, so are the bits.

Every function takes the communicator (mpi4py ``Comm``) and ``run(blocking, nonblocking)``: how a call
waits (a ``_wait.Waiter``'s ``run``; default ``SPIN.run``, MPI's blocking call: the trainer's channels spin or poll); the bytes sent to other ranks, the seconds and the
call go to ``stats`` (a ``CommStats``, optional) under ``dense_allreduce`` / ``sparse_allreduce``.
Collective, blocking; host arrays. Thread safety: none needed (no state).
"""

from __future__ import annotations

import time

import numpy as np

from .._hashing import group_by_owner, owner_of
from .._keys import as_keys
from ..errors import InvalidInputError
from ._compress_kernels import sum_rows_f32
from ._kernels import segment_sum
from ._mpi import mpi_type
from ._stats import DENSE_ALLREDUCE, SPARSE_ALLREDUCE, metered
from ._wait import SPIN


def fold(parts, xp=np):
    """``0 + parts[0] + parts[1] + …`` element-wise, in that order (same-shaped float32 arrays of any
    module ``xp``): what one process computes for the shards' contributions that the ranks' ordered
    all-reduces add in rank order. ``parts`` non-empty."""
    acc = xp.zeros_like(parts[0])
    for a in parts:
        acc += a
    return acc


def ordered_allreduce(comm, vec: np.ndarray, run=SPIN.run, stats=None) -> np.ndarray:
    """Sum of ``vec`` (n,) float32, C-contiguous host, over the ranks of ``comm``, in place, each element
    added in rank order from 0 (module docstring). REQUIRES the same n on every rank. Returns ``vec``."""
    if vec.dtype != np.float32 or vec.ndim != 1 or not vec.flags.c_contiguous:
        raise InvalidInputError(f"ordered_allreduce takes a C-contiguous (n,) float32 vector, got {vec.dtype} "
                                f"{vec.shape}")
    if comm.Get_size() == 1:
        return vec
    with metered(stats, DENSE_ALLREDUCE) as meter:
        _reduce_scatter_allgather(comm, vec, run, meter)
    return vec


def _reduce_scatter_allgather(comm, vec, run, meter) -> None:
    """Chunks of m = ceil(n / p) elements (the vector zero-padded to p m): one alltoall, the fold, one
    allgather. Equal chunks, not alltoallv/allgatherv: MPICH's v-collectives took 4-5x the time of
    ``Allreduce`` on 4 oversubscribed ranks (bench/bench_ordered.py), the equal ones about as long."""
    p, n = comm.Get_size(), vec.shape[0]
    m = -(-n // p)
    padded = vec if n == m * p else np.zeros(m * p, np.float32)
    if padded is not vec:
        padded[:n] = vec
    folded = _reduce_scatter(comm, padded.reshape(p, m), run, meter)
    meter.sent(_allgather(comm, folded, padded.reshape(p, m), run))
    if padded is not vec:
        vec[...] = padded[:n]


def _reduce_scatter(comm, blocks, run, meter) -> np.ndarray:
    p, m = blocks.shape
    parts = np.empty((p, m), np.float32)                         # block `rank` of every rank, rank order
    run(lambda: comm.Alltoall(blocks, parts), lambda: comm.Ialltoall(blocks, parts))
    meter.sent((p - 1) * m * 4)
    return fold_parts(parts)


def fold_parts(parts: np.ndarray) -> np.ndarray:
    """(m,) float32: the rows of ``parts`` (p, m) float32 (any strides: :class:`BlockExchange`'s view) added
    in row (= rank) order from 0: the fold of every ordered reduce-scatter here."""
    folded = np.empty(parts.shape[1], np.float32)
    sum_rows_f32(parts, folded)
    return folded


class PendingReduceScatter:
    """An ordered reduce-scatter in flight (:func:`start_reduce_scatter`). MPI reads ``blocks`` and
    fills ``parts`` until :meth:`wait` returns: the caller leaves ``blocks`` untouched until then.
    Used by one thread."""

    def __init__(self, comm, blocks: np.ndarray, stats=None, parts: np.ndarray | None = None):
        p, m = blocks.shape
        self.blocks = blocks                                       # kept alive while MPI reads it
        self.parts = np.empty((p, m), np.float32) if parts is None else parts
        self.stats, self.nbytes = stats, (p - 1) * m * 4
        self.t0 = time.perf_counter()
        self.request = comm.Ialltoall(blocks, self.parts)
        self.result = None

    def wait(self, run=SPIN.run) -> np.ndarray:
        """(m,) float32: block ``rank`` summed over the ranks in rank order (as
        :func:`ordered_reduce_scatter`). ``run(blocking, nonblocking)`` waits for the request (a channel's
        spin or poll). Idempotent."""
        if self.result is None:
            run(self.request.Wait, lambda: self.request)
            self.result = fold_parts(self.parts)
            if self.stats is not None:
                self.stats.add(DENSE_ALLREDUCE, self.nbytes, time.perf_counter() - self.t0, calls=1)
        return self.result


def start_reduce_scatter(comm, blocks: np.ndarray, stats=None, parts: np.ndarray | None = None) -> PendingReduceScatter:
    """Start :func:`ordered_reduce_scatter` of ``blocks`` (p, m) float32, C-contiguous host, without
    waiting; finish with ``.wait(run)``. Collective: every rank starts it at the same point of its
    sequence of collectives on ``comm`` (others may be issued before the wait). Bytes under
    ``dense_allreduce``. ``parts``: a C-contiguous (p, m) float32 buffer MPI receives into (reused by a
    caller with one reduce-scatter in flight; None: a new one)."""
    _check_blocks(comm, blocks)
    if not blocks.flags.c_contiguous:
        raise InvalidInputError("blocks must be C-contiguous (MPI reads it while the caller works)")
    _check_out(parts, blocks.shape, "parts")
    return PendingReduceScatter(comm, blocks, stats, parts)


class BlockExchange:
    """One Alltoallv of float32 carrying two messages: to rank r, ``[block r (w) | rows for r]``. So a
    mini-batch's dense reduce-scatter (or allgather) rides in its sparse exchange of rows: one wait
    instead of two. :meth:`start` lays the buffers out and gives the (p, w) view the caller writes the
    blocks into (in place: the dense shard's message goes there straight from the gradients);
    :meth:`run` packs the rows, exchanges and gives the rows received and the (p, w) view of the blocks
    received, which arrive as they were sent: folding them (:func:`fold_parts`) gives the bits of
    :func:`start_reduce_scatter`.

    Layout: every rank's segment starts at a multiple of a fixed stride (``w`` + the most rows of a
    segment), so the blocks of the send and of the receive buffer are (p, w) strided views and only the
    rows are copied (a loop over the ranks); the stride's tail is not sent. The buffers are kept from
    call to call (fresh ones of a megabyte cost more in page faults than their copies, 3-4x on this VM):
    the views :meth:`run` returns are valid until the next :meth:`start`. Used by one thread."""

    def __init__(self):
        self._buf: dict = {}
        self._layout = None

    def _grown(self, name: str, n: int) -> np.ndarray:
        buf = self._buf.get(name)
        if buf is None or buf.shape[0] < n:  # a quarter more: the rows per mini-batch vary a little
            buf = self._buf[name] = np.empty(n + n // 4, np.float32)
        return buf[:n]

    def start(self, p: int, w: int, d: int, send, recv) -> np.ndarray:
        """Lay out an exchange of ``send`` (p,) rows of d float32 to each rank and ``recv`` (p,) from each,
        with a block of ``w`` float32 per rank -> the (p, w) float32 view to write block r into row r of."""
        send, recv = np.asarray(send, np.int64), np.asarray(recv, np.int64)
        ss, rs = w + int(send.max()) * d, w + int(recv.max()) * d  # the strides
        sbuf = self._grown("send", p * ss).reshape(p, ss)
        rbuf = self._grown("recv", p * rs).reshape(p, rs)
        at = np.arange(p, dtype=np.int64)
        self._layout = (w, d, send, recv, sbuf, rbuf, (w + send * d, at * ss), (w + recv * d, at * rs))
        return sbuf[:, :w]

    def bytes_to_others(self, rank: int) -> tuple[int, int]:
        """(bytes of rows, bytes of blocks) rank ``rank`` sends the other ranks in the exchange laid out."""
        w, d, send, _, sbuf = self._layout[:5]
        return (int(send.sum()) - int(send[rank])) * d * 4, (sbuf.shape[0] - 1) * w * 4

    def run(self, comm, rows: np.ndarray, run=SPIN.run) -> tuple[np.ndarray, np.ndarray]:
        """Exchange ``rows`` (send.sum(), d) float32 grouped by destination and the blocks written into
        :meth:`start`'s view -> (the rows received (recv.sum(), d) grouped by source, (p, w) the blocks
        received, row s from rank s). Collective over ``comm`` (p ranks); the caller books the bytes."""
        w, d, send, recv, sbuf, rbuf, scounts, rcounts = self._layout
        p = sbuf.shape[0]
        flat, at = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1), 0
        for r in range(p):
            n = int(send[r]) * d
            sbuf[r, w:w + n] = flat[at:at + n]
            at += n
        f32 = mpi_type(np.float32)
        s, g = [sbuf, scounts, f32], [rbuf, rcounts, f32]
        run(lambda: comm.Alltoallv(s, g), lambda: comm.Ialltoallv(s, g))
        got, at = self._grown("rows", int(recv.sum()) * d), 0
        for r in range(p):
            n = int(recv[r]) * d
            got[at:at + n] = rbuf[r, w:w + n]
            at += n
        return got.reshape(-1, d), rbuf[:, :w]


def _check_blocks(comm, blocks) -> None:
    if blocks.dtype != np.float32 or blocks.ndim != 2 or blocks.shape[0] != comm.Get_size():
        raise InvalidInputError(f"blocks must be ({comm.Get_size()}, m) float32, got {blocks.dtype} {blocks.shape}")


def _check_out(out, shape, name: str) -> None:
    """``out`` (None, or a buffer MPI writes into) must be a C-contiguous float32 array of ``shape``."""
    if out is not None and (out.dtype != np.float32 or out.shape != tuple(shape) or not out.flags.c_contiguous):
        raise InvalidInputError(f"{name} must be a C-contiguous {tuple(shape)} float32 array, got {out.dtype} "
                                f"{out.shape}")


def _allgather(comm, chunk, out, run) -> int:
    """Allgather float32 ``chunk`` (m,) into ``out`` (p, m) -> the bytes this rank sent to the others."""
    run(lambda: comm.Allgather(chunk, out), lambda: comm.Iallgather(chunk, out))
    return (comm.Get_size() - 1) * chunk.shape[0] * 4


def ordered_reduce_scatter(comm, blocks: np.ndarray, run=SPIN.run, stats=None) -> np.ndarray:
    """The first half of :func:`ordered_allreduce` with the caller's layout: ``blocks`` (p, m) float32,
    C-contiguous host, row r for rank r -> (m,) float32 ``0 + blocks_0[rank] + blocks_1[rank] + …``,
    rank order (``blocks_s``: rank s's). Collective; bytes under ``dense_allreduce``."""
    _check_blocks(comm, blocks)
    with metered(stats, DENSE_ALLREDUCE) as meter:
        return _reduce_scatter(comm, np.ascontiguousarray(blocks), run, meter)


def allgather_chunks(comm, chunk: np.ndarray, run=SPIN.run, stats=None,
                     out: np.ndarray | None = None) -> np.ndarray:
    """(p, m) float32: every rank's ``chunk`` (m,) float32 host, row r from rank r (into ``out``, a
    C-contiguous (p, m) float32 buffer, when given). Collective; bytes under ``dense_allreduce``."""
    if chunk.dtype != np.float32 or not chunk.flags.c_contiguous:
        chunk = np.ascontiguousarray(chunk, dtype=np.float32)
    shape = (comm.Get_size(), chunk.shape[0])
    _check_out(out, shape, "out")
    out = np.empty(shape, np.float32) if out is None else out
    t0 = time.perf_counter()  # once per mini-batch (the dense shard): no context manager around the call
    nbytes = _allgather(comm, chunk, out, run)
    if stats is not None:
        stats.add(DENSE_ALLREDUCE, nbytes, time.perf_counter() - t0, calls=1)
    return out


def _pack(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(n,) uint64 keys and (n, d) float32 rows -> (n, d + 2) uint32 records (row bits, then the key)."""
    n, d = values.shape
    rec = np.empty((n, d + 2), np.uint32)
    rec[:, :d] = values.view(np.uint32)
    rec[:, d:] = keys.view(np.uint32).reshape(n, 2)
    return rec


def _unpack(rec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = rec.shape[1] - 2
    return (np.ascontiguousarray(rec[:, d:]).view(np.uint64).reshape(-1),
            np.ascontiguousarray(rec[:, :d]).view(np.float32))


def ordered_sparse_allreduce(comm, keys: np.ndarray, values: np.ndarray, run=SPIN.run, stats=None):
    """(keys (m,) uint64, sums (m, d) float32): the union of every rank's ``keys`` (n,) uint64 —
    REQUIRES distinct on each rank — with each key's rows ``values`` (n, d) float32 summed over the
    ranks holding it, in rank order from 0. The same keys, in the same order (owner rank, then the
    order the owner first received them), and the same bits on every rank. Keys are checked as
    ``hps._keys.as_keys``: int64 is taken bitwise, other dtypes raise InvalidTypeError, the sentinel key
    2**64-1 (-1 as int64) InvalidInputError (on the rank that passed them)."""
    p = comm.Get_size()
    keys = as_keys(keys)  # uint64 (int64 bitwise); refuses other dtypes and the sentinel key (typed errors)
    values = np.ascontiguousarray(values, dtype=np.float32)
    if values.ndim != 2 or values.shape[0] != keys.shape[0]:
        raise InvalidInputError(f"values must be (n, d) with n = {keys.shape[0]} keys, got {values.shape}")
    if p == 1:
        return keys, values
    with metered(stats, SPARSE_ALLREDUCE) as meter:
        return _by_owner_then_allgather(comm, keys, values, run, meter)


def _by_owner_then_allgather(comm, keys, values, run, meter):
    from ..mem import unique_counts

    p = comm.Get_size()
    d, w = values.shape[1], values.shape[1] + 2
    order, offsets = group_by_owner(owner_of(keys, p), p)
    send = np.diff(offsets).astype(np.int64)
    recv = np.empty(p, np.int64)
    run(lambda: comm.Alltoall(send, recv), lambda: comm.Ialltoall(send, recv))
    u32 = mpi_type(np.uint32)
    rec = _pack(keys[order], values[order])
    got = np.empty((int(recv.sum()), w), np.uint32)
    s = [rec, (send * w, None), u32]
    g = [got, (recv * w, None), u32]
    run(lambda: comm.Alltoallv(s, g), lambda: comm.Ialltoallv(s, g))
    gk, gv = _unpack(got)
    ukeys, _, inv = unique_counts(gk)                            # first occurrence: rank order
    sums = segment_sum(gv, inv.astype(np.int64), ukeys.shape[0])  # each key's rows in rank order
    mine = _pack(ukeys, sums)
    sizes = np.empty(p, np.int64)
    n_mine = np.array([mine.shape[0]], np.int64)
    run(lambda: comm.Allgather(n_mine, sizes), lambda: comm.Iallgather(n_mine, sizes))
    every = np.empty((int(sizes.sum()), w), np.uint32)
    a = [every, (sizes * w, None), u32]
    run(lambda: comm.Allgatherv([mine, u32], a), lambda: comm.Iallgatherv([mine, u32], a))
    meter.sent(((keys.shape[0] - int(send[comm.Get_rank()])) + mine.shape[0] * (p - 1)) * w * 4)
    return _unpack(every)
