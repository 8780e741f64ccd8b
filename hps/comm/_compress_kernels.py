"""Kernels of the traffic compression (``hps.comm._compress``): bfloat16 and per-row int8.

Kernels only: no I/O, no globals; every array is an argument. All are ``nogil``.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit


@njit(nogil=True, cache=True)
def bf16_encode(bits, out):
    """Round float32 values to bfloat16, to nearest, ties to even (NaN stays a quiet NaN, overflow
    gives inf). bits (n,) uint32: the float32 values viewed as uint32; out (n,) uint16: the upper
    16 bits of the rounded float32."""
    for i in range(bits.shape[0]):
        b = np.int64(bits[i])
        if (b & 0x7F800000) == 0x7F800000 and (b & 0x007FFFFF) != 0:
            out[i] = np.uint16((b >> 16) | 0x0040)
        else:
            out[i] = np.uint16((b + 0x7FFF + ((b >> 16) & 1)) >> 16)


@njit(nogil=True, cache=True)
def bf16_decode(half, out):
    """half (n,) uint16 bfloat16 -> out (n,) uint32, the float32 bits (exact)."""
    for i in range(half.shape[0]):
        out[i] = np.uint32(half[i]) << np.uint32(16)


@njit(nogil=True, cache=True)
def int8_encode_rows(x, q, scale_bits):
    """Symmetric per-row int8 with a bfloat16 scale: ``s`` = ``max|x[i]| / 127`` rounded to bfloat16
    (nearest even), ``q[i] = round(x[i] * (1 / s))`` clipped to [-127, 127]. Each decoded value
    ``q * s`` is then within ``(1 + 2^-8) / 2 * max|x[i]| / 127`` of ``x`` (half a step, the step
    rounded to bfloat16). Two kinds of row are sent with ``q[i] = 0`` instead:

    - a row holding a NaN or an inf gets the NaN scale (bits ``0x7FC0``): it decodes as all NaN,
      so a diverged row stays visible (the sign of an inf is not kept);
    - a row whose bfloat16 scale would be zero or subnormal (``max|x[i]|`` below about
      ``127 * 2^-126``, 1.5e-36; a row of zeros included) gets ``s = 0`` and decodes as zeros,
      within 1.5e-36 of ``x`` (a subnormal scale loses its precision: 1e-40 came back 1e-37).

    x (n, d) float32; q (n, d) int8; scale_bits (n,) uint16, the bfloat16 bits of each row's s."""
    for i in range(x.shape[0]):
        amax = np.float32(0.0)
        nan = False
        for j in range(x.shape[1]):
            a = abs(x[i, j])
            if a > amax:
                amax = a
            elif a != a:
                nan = True
        if nan or amax == np.inf:
            scale_bits[i] = np.uint16(0x7FC0)
            q[i, :] = 0
            continue
        b = np.int64(np.array([amax / np.float32(127.0)], np.float32).view(np.uint32)[0])
        h = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        if h < 0x0080:                      # zero or subnormal bfloat16 scale: send zeros
            scale_bits[i] = np.uint16(0)
            q[i, :] = 0
            continue
        scale_bits[i] = np.uint16(h)
        s = np.array([np.uint32(h << 16)], np.uint32).view(np.float32)[0]
        inv = np.float32(1.0) / s           # finite: s >= 2^-126
        for j in range(x.shape[1]):
            v = np.rint(x[i, j] * inv)
            if v > 127:
                v = 127
            elif v < -127:
                v = -127
            q[i, j] = np.int8(v)


@njit(nogil=True, cache=True)
def int8_decode_rows(q, scale_bits, out):
    """out[i, j] = q[i, j] * s[i]; q (n, d) int8, scale_bits (n,) uint16 bfloat16 scales, out (n, d) float32."""
    for i in range(q.shape[0]):
        s = np.array([np.uint32(np.uint32(scale_bits[i]) << np.uint32(16))], np.uint32).view(np.float32)[0]
        for j in range(q.shape[1]):
            out[i, j] = np.float32(q[i, j]) * s


@njit(nogil=True, cache=True)
def sum_rows_f32(parts, out):
    """out (m,) float32 = sum over k of parts[k] (k, m) float32, added in row order (deterministic)."""
    out[:] = 0
    for k in range(parts.shape[0]):
        for j in range(parts.shape[1]):
            out[j] += parts[k, j]
