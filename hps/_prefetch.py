"""``prefetch(arr, i)``: a Numba intrinsic that asks the CPU to bring ``arr[i]`` into cache;
``prefetch_home(tab, key)``, the home cell of a key in a hash table; ``home_ahead(tab, keys, i, ring)``, the
same cell hashed once for the probe ``prefetch_ahead()`` keys later (the hash-once ring: ``ahead_ring()`` its
scratch, ``ring_start``/``ring_next`` its loop); ``prefetch_ahead()``, how many keys
ahead of its probe a batch kernel prefetches a key's cell; ``prefetch_row_write(out, r)``, every cache
line of row ``r`` of a 2-d array, for writing (a kernel that writes whole rows at scattered rows).

A hint only (LLVM's ``llvm.prefetch``: read or write, high locality); it never faults and changes no
result.
Kernels whose per-key bodies are long chains of dependent loads (the MEM-PS cache: hash probe ->
slot -> its fields) use a pre-pass of prefetches over the batch, so the misses of many keys overlap
instead of stalling one key at a time (measured in ``hps/mem/_cache_kernels.py``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ._hashing import mix64
from ._jit import njit


def _emit_prefetch(context, builder, aryty, ary, idxty, idx, offset, rw):
    """``llvm.prefetch`` of the byte ``offset`` past the start of ``ary[idx]`` (rw 0 read, 1 write;
    locality 3 = keep in all cache levels, cache type 1 = data). ``idx`` (of Numba type ``idxty``) is
    widened to intp first: a strided array's address multiplies it by an intp stride."""
    ary = context.make_array(aryty)(context, builder, ary)
    idx = context.cast(builder, idx, idxty, types.intp)
    index = [idx] + [context.get_constant(types.intp, 0)] * (aryty.ndim - 1)
    ptr = cgutils.get_item_pointer(context, builder, aryty, ary, index, wraparound=False)
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    ptr = builder.gep(builder.bitcast(ptr, i8p), [offset])
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0")
    builder.call(fn, [ptr, i32(rw), i32(3), i32(1)])


@intrinsic
def prefetch(typingctx, arr, idx):
    """Prefetch ``arr[idx]`` (for a 2-d array, the start of row ``idx``). No bounds check."""
    if not isinstance(arr, types.Array) or arr.ndim not in (1, 2) or not isinstance(idx, types.Integer):
        return None
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        _emit_prefetch(context, builder, signature.args[0], args[0], signature.args[1], args[1],
                       context.get_constant(types.intp, 0), 0)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _prefetch_write_at(typingctx, arr, idx, offset):
    """Prefetch for writing the byte ``offset`` (intp) past the start of row ``idx`` of a 2-d array."""
    if (not isinstance(arr, types.Array) or arr.ndim != 2 or not isinstance(idx, types.Integer)
            or not isinstance(offset, types.Integer)):
        return None
    sig = types.void(arr, idx, types.intp)

    def codegen(context, builder, signature, args):
        _emit_prefetch(context, builder, signature.args[0], args[0], signature.args[1], args[1], args[2], 1)
        return context.get_dummy_value()

    return sig, codegen


@njit(nogil=True, cache=True, inline="always")
def prefetch_row_write(out, r):
    """Prefetch for writing every 64-byte cache line of row ``r`` of ``out`` (2-d, rows contiguous), so
    that the read-for-ownership misses of a kernel writing whole rows at scattered rows overlap
    (``prefetch_ahead()`` rows ahead) instead of stalling row by row. No bounds check; a hint only."""
    nbytes = out.shape[1] * out.itemsize
    for b in range(0, nbytes, 64):
        _prefetch_write_at(out, r, b)
    if nbytes:  # a row that does not start on a line boundary ends in one more line
        _prefetch_write_at(out, r, nbytes - 1)


@njit(nogil=True, cache=True, inline="always")
def prefetch_ahead():
    """Keys between the prefetch of a key's cell and its probe in the batch kernels (16; a function, not
    a module global, which Numba would freeze into cached kernels). On an HBM-PS twin of 8 M slots,
    1 M live, it took ``hps.table``'s ``claim`` from 44 to 25 ns a key and ``lookup`` from 36 to 21
    (timed around the kernels on the shared 2-core VM, 2026-11-26: indicative, not a benchmark)."""
    return 16


@njit(nogil=True, cache=True, inline="always")
def prefetch_home(tab, key):
    """Prefetch the home cell ``mix64(key) & (S - 1)`` of ``key`` in ``tab`` (S,), S a power of two
    (any linear-probing table of this project, or an array in step with one)."""
    prefetch(tab, mix64(key) & np.uint64(tab.shape[0] - 1))


@njit(nogil=True, cache=True, inline="always")
def home_ahead(tab, keys, i, ring):
    """Home cell ``mix64(keys[i]) & (S - 1)`` of ``keys[i]`` in ``tab`` (S,), S a power of two, kept in
    ``ring`` (R,) uint64 (R = ``prefetch_ahead()``, a power of two) at ``i & (R - 1)``, prefetched and
    returned (a caller prefetches the same cell of arrays in step with ``tab``): the probe R keys later
    reads it back instead of hashing the key again (one ``mix64`` a key, not two: ~25 % of the host
    dedup's ``_unique_segments`` time on a 65,536 x 26 batch, 14 -> 10 ms thread time on the shared
    2-core VM)."""
    h = mix64(keys[i]) & np.uint64(tab.shape[0] - 1)
    ring[i & (ring.shape[0] - 1)] = h
    prefetch(tab, h)
    return h


def ahead_ring() -> np.ndarray:
    """The scratch of the hash-once ring, passed to a kernel (which then allocates nothing and may be
    compiled without reference counting): (``prefetch_ahead()``,) uint64 (its Python body: no dispatch,
    no compile)."""
    return np.empty(prefetch_ahead.py_func(), dtype=np.uint64)


@njit(nogil=True, cache=True, inline="always")
def ring_start(tab, also, keys, ring):
    """Start a batch kernel's hash-once ring: the home cells of ``keys[:R]`` in ``tab`` hashed into
    ``ring`` (:func:`home_ahead`) and prefetched there and in ``also`` (an array in step with ``tab``'s
    cells, 1-d or rows). Then ``h = ring_next(...)`` before the probe of each key i = 0, 1, ...
    In a kernel compiled with ``_nrt=False`` (array arguments of inlined helpers otherwise get atomic
    reference counts in the loop: 3x slower, measured on the CPU twin's ``get``)."""
    for a in range(min(ring.shape[0], keys.shape[0])):
        prefetch(also, home_ahead(tab, keys, a, ring))


@njit(nogil=True, cache=True, inline="always")
def ring_next(tab, also, keys, i, ring):
    """The home cell of ``keys[i]``, hashed R keys earlier; then that of ``keys[i + R]`` is hashed and
    prefetched as in :func:`ring_start`."""
    ahead = ring.shape[0]
    h = ring[i & (ahead - 1)]   # read before keys[i + R] takes its place
    if i + ahead < keys.shape[0]:
        prefetch(also, home_ahead(tab, keys, i + ahead, ring))
    return h
