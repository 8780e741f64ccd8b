"""Numba kernel that parses Criteo TSV lines straight into keys (kernels only: no I/O, no globals).

One pass over the bytes: each column is read up to the tab (or line end) that closes it, with its
value parsed and, for a categorical, hashed into its key as it goes — no separate scan for the line
end or the column bounds, and no ``values`` array between parsing and hashing. Contract as the other
``parse_*`` kernels (``_parse_kernels``): ``buf`` (m,) uint8 of whole lines ending in ``\\n`` (a
``\\r`` before it is ignored); valid lines fill rows ``0 .. n_ok-1`` in order; malformed lines are
skipped, the first ``bad_line.shape[0]`` recorded (0-based line in ``buf``, reason code); blank
lines are neither; ``strict`` stops after the first malformed line; returns ``(n_lines, n_ok,
n_bad, n_blank)``. Blocking, single-threaded, ``nogil``.
"""

from __future__ import annotations

import math

import numpy as np

from .._hashing import mix64
from .._jit import njit
from ._parse_kernels import blank_line, record_bad


@njit(nogil=True, cache=True)
def log1p_table(n):
    """(n,) float32: float32(log1p(v)) of v = 0 .. n-1, as the kernel computes it for larger v."""
    out = np.empty(n, dtype=np.float32)
    for v in range(n):
        out[v] = math.log1p(v)
    return out


@njit(nogil=True, cache=True)
def hex_digits():
    """(256,) int8: the value of each byte as a hex digit, -1 for the others."""
    out = np.full(256, -1, dtype=np.int8)
    for c in range(10):
        out[48 + c] = c
    for c in range(6):
        out[97 + c] = 10 + c
        out[65 + c] = 10 + c
    return out


@njit(nogil=True, cache=True, inline="always")
def _ends(buf, i):
    """Whether buf[i] closes a column: a tab, the ``\\n`` or a ``\\r`` before it."""
    c = buf[i]  # (one load, tested in this order: written with a helper, the kernel runs at half speed)
    return c == 9 or c == 10 or (c == 13 and buf[i + 1] == 10)


@njit(nogil=True, cache=True, inline="always")
def _int_column(buf, i):
    """(status, value, end) of the decimal column starting at buf[i]: status 0 empty, 1 a valid
    optional sign and 1-18 digits, -1 malformed; ``end`` the byte after it (the closing one when
    valid or empty)."""
    c = buf[i]
    signed = c == 45 or c == 43
    neg = c == 45
    if signed:
        i += 1
    nd = 0
    v = np.int64(0)
    while True:
        d = np.int64(buf[i]) - 48
        if d < 0 or d > 9:
            break
        v = v * 10 + d
        nd += 1
        i += 1
    if not _ends(buf, i):
        return -1, v, i
    if nd == 0:
        return (-1 if signed else 0), v, i
    if nd > 18:
        return -1, v, i
    return 1, (-v if neg else v), i


@njit(nogil=True, cache=True, inline="always")
def _key(field, value, shift, low):
    return (np.uint64(field) << shift) | (mix64(value) >> low)


@njit(nogil=True, cache=True)
def parse_criteo_keys(buf, int_as_cat, strict, missing, negative, codes, hexv, log1p_tab, shift,
                      labels, dense, keys, bad_line, bad_code):
    """Criteo TSV: label, 13 integer counts, 26 hex categoricals (40 tab-separated columns).

    labels (n,) float32; dense (n, 13) float32 = log1p(max(x, 0)) (``log1p_tab`` (t,) float32 for x <
    t, ``log1p_table``), missing -> 0; keys (n, 26 or 39) uint64: ``(j << shift) | mix64(v) >> (64 -
    shift)`` (``make_keys``) of field j: the value of hex categorical j (``missing`` when empty); with
    ``int_as_cat`` fields 26..38 of floor(log2(1+x)) of the integers (``missing`` when empty,
    ``negative`` when x < 0). hexv: ``hex_digits()``. codes = (BAD_COLUMNS, BAD_LABEL, BAD_NUMBER,
    BAD_HEX). A column's own error is reported before a wrong column count (left to right).
    """
    n = buf.shape[0]
    sh = np.uint64(shift)
    low = np.uint64(64 - shift)
    ntab = log1p_tab.shape[0]
    pos = 0
    n_lines = 0
    r = 0
    n_bad = 0
    n_blank = 0
    while pos < n:
        line = n_lines
        n_lines += 1
        k = blank_line(buf, pos)
        if k:
            n_blank += 1
            pos += k
            continue
        code = 0
        st, v, i = _int_column(buf, pos)
        if st != 1 or (v != 0 and v != 1):
            code = codes[1]
        elif buf[i] != 9:
            code = codes[0]
        else:
            labels[r] = v
            for col in range(13):
                st, v, i = _int_column(buf, i + 1)
                if st < 0:
                    code = codes[2]
                    break
                if buf[i] != 9:
                    code = codes[0]
                    break
                if st == 0:
                    dense[r, col] = 0.0
                    if int_as_cat:
                        keys[r, 26 + col] = _key(26 + col, missing, sh, low)
                    continue
                dense[r, col] = 0.0 if v <= 0 else log1p_tab[v] if v < ntab else math.log1p(v)
                if int_as_cat:
                    if v < 0:
                        b = negative
                    else:
                        b = np.uint64(0)
                        x = v + 1
                        while x > 1:
                            x >>= 1
                            b += np.uint64(1)
                    keys[r, 26 + col] = _key(26 + col, b, sh, low)
            if code == 0:
                for f in range(26):
                    i += 1
                    h = np.uint64(0)
                    nd = 0
                    while True:
                        x = hexv[buf[i]]
                        if x < 0:
                            break
                        h = (h << np.uint64(4)) | np.uint64(x)
                        nd += 1
                        i += 1
                    if nd > 8 or not _ends(buf, i):
                        code = codes[3]
                        break
                    keys[r, f] = _key(f, missing if nd == 0 else h, sh, low)
                    if (buf[i] == 9) != (f < 25):  # a line ends early, or a 41st column
                        code = codes[0]
                        break
        while buf[i] != 10:  # to the end of the line
            i += 1
        pos = i + 1
        if code == 0:
            r += 1
        else:
            n_bad = record_bad(bad_line, bad_code, n_bad, line, code)
            if strict:
                break
    return n_lines, r, n_bad, n_blank
