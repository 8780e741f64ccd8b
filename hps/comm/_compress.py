"""Compressed MPI traffic (``--compress {none,bf16,int8}``; Hierarchical Training §4.2).

What crosses MPI in each mode (the receiver decompresses to float32 and every reduction adds
float32 values, never bfloat16 ones):

====================================  =======  =========  ==========================
traffic (``bytes_sent`` kind)          none     bf16       int8
====================================  =======  =========  ==========================
dense gradients (``dense_allreduce``)  float32  bfloat16   bfloat16 (gradients stay bf16, §4.2)
EASGD exchanges (``dense_easgd``)      float32  bfloat16   bfloat16
rows an owner serves (``sparse_rows``)  float32  bfloat16   int8 + one bfloat16 scale per row
gradients to owners (``sparse_grads``)  float32  bfloat16   bfloat16
====================================  =======  =========  ==========================

bfloat16 is the upper half of a float32 rounded to nearest, ties to even (``to_bf16``); int8 rows
are symmetric per row (``scale = max|x| / 127``, rounded to bfloat16: a row of d values takes
d + 2 bytes instead of 4 d). ``none`` calls the channel's own methods, so its
bytes and results are exactly those of an uncompressed job. ``--sparse-sync allreduce`` (the
hierarchical sparse all-reduce) and residency pulls of whole rows (optimizer state included) are
never compressed: the owner's stored rows stay exact.

Every function takes a channel (``hps.train._collectives.Channel``: ``size``, ``rank``,
``alltoallv``, ``allgatherv``, ``dense_allreduce``) and is collective over it. Thread safety: the
:class:`Compression` object holds no state; each call uses only its channel.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from . import _compress_kernels as K
from ._stats import DENSE_ALLREDUCE

#: ``--compress`` modes.
COMPRESS_MODES = ("none", "bf16", "int8")
#: Bytes of an int8 row's scale (a bfloat16 before the row's values).
INT8_SCALE_BYTES = 2


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 array (any shape) -> uint16 array of the same shape: bfloat16, round to nearest even."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x.shape, np.uint16)
    K.bf16_encode(x.reshape(-1).view(np.uint32), out.reshape(-1))
    return out


def from_bf16(h: np.ndarray) -> np.ndarray:
    """uint16 bfloat16 array -> float32 array of the same shape (exact)."""
    h = np.ascontiguousarray(h, dtype=np.uint16)
    out = np.empty(h.shape, np.uint32)
    K.bf16_decode(h.reshape(-1), out.reshape(-1))
    return out.view(np.float32)


def to_int8_rows(x: np.ndarray) -> np.ndarray:
    """(n, d) float32 -> (n, 2 + d) uint8: each row's bfloat16 scale, then its d int8 values.

    Decoded rows are within ``(1 + 2^-8) / 2 * max|row| / 127``; rows with ``max|row|`` below about
    1.5e-36 decode as zeros, rows holding a NaN or an inf as all NaN (``K.int8_encode_rows``)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    n, d = x.shape
    q, scale = np.empty((n, d), np.int8), np.empty(n, np.uint16)
    K.int8_encode_rows(x, q, scale)
    packed = np.empty((n, INT8_SCALE_BYTES + d), np.uint8)
    packed[:, :INT8_SCALE_BYTES] = scale.view(np.uint8).reshape(n, INT8_SCALE_BYTES)
    packed[:, INT8_SCALE_BYTES:] = q.view(np.uint8)
    return packed


def from_int8_rows(packed: np.ndarray) -> np.ndarray:
    """Inverse of :func:`to_int8_rows`: (n, 2 + d) uint8 -> (n, d) float32."""
    n = packed.shape[0]
    scale = np.ascontiguousarray(packed[:, :INT8_SCALE_BYTES]).view(np.uint16).reshape(n)
    q = np.ascontiguousarray(packed[:, INT8_SCALE_BYTES:]).view(np.int8)
    out = np.empty(q.shape, np.float32)
    K.int8_decode_rows(q, scale, out)
    return out


def allreduce_bf16(ch, vec: np.ndarray, kind: str) -> np.ndarray:
    """Element-wise sum over the ranks of ``ch`` of ``vec`` (n,) float32, sent as bfloat16 and added
    in float32: a reduce-scatter (alltoallv of bf16 chunks; rank r sums chunk r of every rank in
    rank order) then an allgather of the bf16-rounded sums. Every rank gets the same bits. Sends
    2 (p - 1) / p of the vector's bf16 bytes per rank (half the float32 all-reduce). Collective."""
    p = ch.size
    if p == 1:
        return vec
    n = vec.shape[0]
    m = -(-n // p)
    padded = np.zeros(m * p, np.float32)
    padded[:n] = vec
    ones = np.ones(p, np.int64)
    parts = ch.alltoallv(to_bf16(padded).reshape(p, m), ones, ones, kind)   # chunk `rank` of every rank
    mine = np.empty(m, np.float32)
    K.sum_rows_f32(from_bf16(parts), mine)
    every = ch.allgatherv(to_bf16(mine).reshape(1, m), kind)
    out = from_bf16(every).reshape(-1)[:n]
    vec[...] = out
    return vec


class Compression:
    """The formats of one ``--compress`` mode (see the module docstring). ``dense`` and ``grads``
    are ``"none"`` or ``"bf16"``; ``rows`` is ``"none"``, ``"bf16"`` or ``"int8"``."""

    def __init__(self, mode: str = "none"):
        if mode not in COMPRESS_MODES:
            raise InvalidInputError(f"compress must be one of {', '.join(COMPRESS_MODES)}; got {mode!r}")
        self.mode = mode
        self.rows = mode
        self.grads = self.dense = "none" if mode == "none" else "bf16"

    def allreduce_dense(self, ch, vec: np.ndarray) -> np.ndarray:
        """Sum of the dense gradients ``vec`` (n,) float32 over ``ch``'s ranks, in place (bytes under
        ``dense_allreduce``). ``none``: the channel's own ``dense_allreduce``."""
        if self.dense == "none":
            return ch.dense_allreduce(vec)
        return allreduce_bf16(ch, vec, DENSE_ALLREDUCE)

    def exchange_rows(self, ch, rows, send, recv, kind):
        """``ch.alltoallv`` of embedding rows (n, d) float32 in this mode's row format -> the
        received rows as float32, grouped by source."""
        return exchange(ch, rows, send, recv, kind, self.rows)

    def exchange_grads(self, ch, grads, send, recv, kind):
        """``ch.alltoallv`` of gradient rows (n, d) float32 in this mode's gradient format."""
        return exchange(ch, grads, send, recv, kind, self.grads)

    def warm_up(self) -> None:
        """Compile (or load from Numba's cache) this mode's kernels on a few local values."""
        if self.mode == "none":
            return
        x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
        from_bf16(to_bf16(x))
        from_int8_rows(to_int8_rows(x))
        K.sum_rows_f32(x, np.empty(x.shape[1], np.float32))


def exchange(ch, rows, send, recv, kind, fmt: str):
    """Alltoallv of (n, d) float32 rows in format ``fmt`` (none/bf16/int8); returns float32 rows.
    A one-process channel returns ``rows`` as they are (nothing crosses MPI)."""
    if fmt == "none" or ch.size == 1:
        return ch.alltoallv(rows, send, recv, kind)
    if fmt == "bf16":
        return from_bf16(ch.alltoallv(to_bf16(rows), send, recv, kind))
    return from_int8_rows(ch.alltoallv(to_int8_rows(rows), send, recv, kind))
