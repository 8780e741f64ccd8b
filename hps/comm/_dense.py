"""Dense all-reduce: the element-wise sum of one same-shaped array per rank."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError, InvalidTypeError
from ._cuda import copy_to_device, is_device_array, to_device_like, to_host
from ._schedule import hierarchical_allreduce
from ._stats import DENSE_ALLREDUCE, metered

_TAG = 7321


class _DenseCodec:
    """Payload = the result buffer ``buf``; messages land in ``tmp``; combine adds into ``buf``.

    ``xp`` is NumPy, or CuPy on the CUDA-aware device path (then the device is synchronised after
    every add, before the next MPI call touches the buffer). Every MPI call waits as ``waiter`` says
    (``_wait.Waiter``: spin or yield).
    """

    def __init__(self, buf, xp, sync, waiter):
        self.buf = buf
        self.tmp = xp.empty_like(buf)
        self.xp = xp
        self.sync = sync
        self.w = waiter

    def send(self, comm, dest, p, meter):
        self.w.send(comm, p, dest, _TAG)
        meter.sent(p.nbytes)

    def recv(self, comm, src, meter):
        self.w.recv(comm, self.tmp, src, _TAG)
        return self.tmp

    def sendrecv(self, comm, partner, p, meter):
        self.w.sendrecv(comm, p, self.tmp, partner, _TAG)
        meter.sent(p.nbytes)
        return self.tmp

    def combine(self, low, high):
        self.xp.add(low, high, out=self.buf)  # one operand is buf: element-wise, aliasing is safe
        self.sync()
        return self.buf

    def bcast(self, comm, p, meter):
        size = comm.Get_size()
        if p is not None and p is not self.buf:
            self.buf[...] = p
            self.sync()
        if size > 1:
            self.w.bcast(comm, self.buf)
            if comm.Get_rank() == 0:
                meter.sent(self.buf.nbytes * (size - 1))
        return self.buf


def _host_result(a, out):
    """The host buffer the reduction runs in: ``out`` (filled with ``a``) or a fresh copy of ``a``."""
    if out is None:
        return np.array(a, order="C", copy=True)
    if not isinstance(out, np.ndarray) or out.shape != a.shape or out.dtype != a.dtype:
        raise InvalidInputError(f"out must be a host array of shape {a.shape} and dtype {a.dtype}")
    if not out.flags.c_contiguous:
        raise InvalidInputError("out must be C-contiguous")
    if out is not a:
        out[...] = a
    return out


def dense_allreduce(topo, array, out=None, stats=None):
    """Hierarchical element-wise sum of ``array`` over all ranks of ``topo``; returns the sum.

    array: any shape, numeric dtype (float32/float64 typical), host or device; REQUIRES the same shape
    and dtype on every rank. out: optional array of the same shape/dtype and device kind to write
    into (may be ``array`` itself: in place); otherwise a new array is returned. Blocking, collective.

    Schedule: binomial-tree reduce to the node leader, recursive doubling among node leaders,
    broadcast inside the node. Every rank gets identical bits (each pairwise add has a fixed place
    in the schedule). Device arrays go to MPI directly when ``topo.cuda_aware`` (CuPy needed for the
    adds), else they are staged through pinned host memory. Every MPI call waits as ``topo.waiter``
    says (spin or yield: ``Topology(wait=...)``). Bytes go to ``stats`` under ``"dense_allreduce"``.
    """
    device = is_device_array(array)
    if device and out is not None and not is_device_array(out):
        raise InvalidInputError("out must be a device array when array is one")
    with metered(stats, DENSE_ALLREDUCE) as meter:
        if device and topo.cuda_aware:
            import cupy

            a = cupy.asarray(array)
            buf = cupy.array(a, copy=True) if out is None else cupy.asarray(out)
            if out is not None and buf.data.ptr != a.data.ptr:
                buf[...] = a
            cupy.cuda.Device().synchronize()
            codec = _DenseCodec(buf, cupy, cupy.cuda.Device().synchronize, topo.waiter)
            hierarchical_allreduce(topo, buf, codec, meter)
            return out if out is not None else buf
        a = to_host(array) if device else np.asarray(array)
        if a.dtype.kind not in "fiu":
            raise InvalidTypeError(f"array must be numeric, got {a.dtype}")
        buf = _host_result(a, None if device else out)
        codec = _DenseCodec(buf, np, lambda: None, topo.waiter)
        hierarchical_allreduce(topo, buf, codec, meter)
    if device:
        if out is None:
            return to_device_like(buf, array)
        copy_to_device(buf, out)
        return out
    return buf
