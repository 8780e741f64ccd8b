"""Sparse all-reduce: every rank ends with the union of all keys, each with the sum of its rows."""

from __future__ import annotations

import numpy as np

from .._keys import as_keys
from ..errors import InvalidInputError, InvalidTypeError
from . import _kernels as K
from ._cuda import is_device_array, to_device_like, to_host
from ._mpi import MPI
from ._schedule import hierarchical_allreduce
from ._stats import SPARSE_ALLREDUCE, metered
from ._wait import SPIN

_TAG_KEYS = 7311  # point-to-point tags on the Topology's private communicators
_TAG_ROWS = 7312


def _check_sparse(keys, values):
    """Host (keys (n,) uint64, values (n, d) float32/64, device_like or None)."""
    like = values if is_device_array(values) else None
    keys = as_keys(to_host(keys) if is_device_array(keys) else keys)
    values = to_host(values) if like is not None else np.asarray(values)
    if values.ndim != 2 or values.shape[0] != keys.shape[0]:
        raise InvalidInputError(f"values must have shape (n, d) with n = len(keys) = {keys.shape[0]}, got {values.shape}")
    if values.dtype not in (np.float32, np.float64):
        raise InvalidTypeError(f"values must be float32 or float64, got {values.dtype}")
    return keys, np.ascontiguousarray(values), like


def local_reduce(keys, values):
    """Sort ``keys`` ascending and sum the rows of duplicates (in input order). Host arrays in and out."""
    n = keys.shape[0]
    if n == 0 or bool(np.all(keys[1:] > keys[:-1])):
        return keys.copy(), values.copy()
    order = np.argsort(keys, kind="stable")
    return K.reduce_sorted(keys[order], values[order])


def compile_kernels(width: int, dtype=np.float32) -> None:
    """Compile (or load from Numba's cache) the kernels of the sparse all-reduce for rows of ``width``
    values of ``dtype``, on a few local rows: no communication. Blocking."""
    keys = np.array([2, 1, 2], dtype=np.uint64)
    k, v = local_reduce(keys, np.zeros((3, int(width)), dtype=dtype))
    K.merge_sum(k, v, k, v)


class _SparseCodec:
    """Payload = (keys (m,) uint64 strictly ascending, values (m, d)); combine = merge-by-key sum.
    Every MPI call waits as ``waiter`` says (``_wait.Waiter``: spin or yield)."""

    def __init__(self, d, dtype, waiter):
        self.d = d
        self.dtype = np.dtype(dtype)
        self.w = waiter

    def _recv_into(self, comm, src):
        status = MPI.Status()
        self.w.probe(comm, src, _TAG_KEYS, status)
        m = status.Get_count(MPI.UINT64_T)
        keys = np.empty(m, dtype=np.uint64)
        self.w.recv(comm, [keys, MPI.UINT64_T], src, _TAG_KEYS)
        values = np.empty((m, self.d), dtype=self.dtype)
        self.w.recv(comm, values, src, _TAG_ROWS)
        return keys, values

    def send(self, comm, dest, p, meter):
        keys, values = p
        self.w.send(comm, [keys, MPI.UINT64_T], dest, _TAG_KEYS)
        self.w.send(comm, values, dest, _TAG_ROWS)
        meter.sent(keys.nbytes + values.nbytes)

    def recv(self, comm, src, meter):
        return self._recv_into(comm, src)

    def sendrecv(self, comm, partner, p, meter):
        keys, values = p
        reqs = [comm.Isend([keys, MPI.UINT64_T], partner, _TAG_KEYS), comm.Isend(values, partner, _TAG_ROWS)]
        other = self._recv_into(comm, partner)
        self.w.wait_all(reqs)
        meter.sent(keys.nbytes + values.nbytes)
        return other

    def combine(self, low, high):
        return K.merge_sum(low[0], low[1], high[0], high[1])

    def bcast(self, comm, p, meter):
        size = comm.Get_size()
        if size == 1:
            return p
        root = comm.Get_rank() == 0
        m = np.array([p[0].shape[0] if root else 0], dtype=np.int64)
        self.w.bcast(comm, m)
        if root:
            keys, values = p
            meter.sent((keys.nbytes + values.nbytes) * (size - 1))
        else:
            keys = np.empty(int(m[0]), dtype=np.uint64)
            values = np.empty((int(m[0]), self.d), dtype=self.dtype)
        self.w.bcast(comm, [keys, MPI.UINT64_T])
        self.w.bcast(comm, values)
        return keys, values


def sparse_allreduce(topo, keys, values, stats=None):
    """Hierarchical sparse all-reduce (Appendix C.3): sum rows by key over all ranks of ``topo``.

    keys (n,) uint64 (duplicates allowed, any order; the sentinel 2**64-1 is rejected); values (n, d)
    float32 or float64, host or device. REQUIRES: the same d and dtype on every rank. Blocking,
    collective over ``topo.comm``.

    Returns (keys (m,) uint64 strictly ascending — the union of every rank's keys, values (m, d) — each
    key's rows summed over all ranks and duplicates). The result has identical bits on every rank:
    duplicates are summed in input order, then partial sums are combined pairwise at fixed places of
    the schedule (IEEE addition of two operands is commutative). Device inputs are staged: the merge
    runs on the host and the result comes back as a device array of the input's kind.

    Every MPI call waits as ``topo.waiter`` says (spin or yield: ``Topology(wait=...)``). Bytes sent
    are added to ``stats`` (a CommStats) under ``"sparse_allreduce"``.
    """
    keys, values, like = _check_sparse(keys, values)
    with metered(stats, SPARSE_ALLREDUCE) as meter:
        p = local_reduce(keys, values)
        codec = _SparseCodec(values.shape[1], values.dtype, topo.waiter)
        out_k, out_v = hierarchical_allreduce(topo, p, codec, meter)
    if like is not None:
        return out_k, to_device_like(out_v, like)
    return out_k, out_v


def sparse_allreduce_allgather(comm, keys, values, stats=None, waiter=SPIN):
    """Baseline sparse all-reduce: every rank allgathers every rank's (locally reduced) rows and merges.

    Same contract as :func:`sparse_allreduce` and the same sums up to rounding (identical bits on every
    rank: all ranks reduce the same gathered arrays in rank order, but not necessarily the bits of the
    hierarchical schedule), on a plain communicator, and each rank sends its rows to size - 1 ranks. For
    benchmarks. MPI calls wait as ``waiter`` says (``_wait.Waiter``; default: spin). Bytes go to ``stats``
    under ``"sparse_allreduce"``.
    """
    keys, values, like = _check_sparse(keys, values)
    size = comm.Get_size()
    d, dtype = values.shape[1], values.dtype
    with metered(stats, SPARSE_ALLREDUCE) as meter:
        lk, lv = local_reduce(keys, values)
        if size == 1:
            out_k, out_v = lk, lv
        else:
            n, counts = np.array([lk.shape[0]], np.int64), np.empty(size, np.int64)
            waiter.run(lambda: comm.Allgather(n, counts), lambda: comm.Iallgather(n, counts))
            total = int(counts.sum())
            all_k = np.empty(total, dtype=np.uint64)
            all_v = np.empty((total, d), dtype=dtype)
            sk, rk = [lk, MPI.UINT64_T], [all_k, (counts, None), MPI.UINT64_T]
            rv = [all_v, (counts * d, None)]
            waiter.run(lambda: comm.Allgatherv(sk, rk), lambda: comm.Iallgatherv(sk, rk))
            waiter.run(lambda: comm.Allgatherv(lv, rv), lambda: comm.Iallgatherv(lv, rv))
            meter.sent((lk.nbytes + lv.nbytes) * (size - 1))
            order = np.argsort(all_k, kind="stable")
            out_k, out_v = K.reduce_sorted(all_k[order], all_v[order])
    if like is not None:
        return out_k, to_device_like(out_v, like)
    return out_k, out_v
