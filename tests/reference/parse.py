"""The text parse kernels as they were before the one-pass kernels (``hps.data._criteo_kernels``,
``hps.data._parse_kernels.parse_csv``): a scan for each line's end, then one for each column's bounds,
then the value — simple enough to check by eye, and the semantics the fast kernels must keep
exactly. They write feature *values*; ``make_keys`` turns them into keys. Tests only."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from hps.data._parse_kernels import _fnv1a, _line_end, _parse_float, _parse_float32, _parse_int


@njit(nogil=True, cache=True, inline="always")
def _parse_hex(buf, a, b):
    """(ok, uint64 value) of 1-8 hex digits filling buf[a:b]."""
    if a >= b or b - a > 8:
        return False, np.uint64(0)
    v = np.uint64(0)
    for i in range(a, b):
        c = buf[i]
        if 48 <= c <= 57:
            d = c - 48
        elif 97 <= c <= 102:
            d = c - 87
        elif 65 <= c <= 70:
            d = c - 55
        else:
            return False, np.uint64(0)
        v = (v << np.uint64(4)) | np.uint64(d)
    return True, v


@njit(nogil=True, cache=True, inline="always")
def _log2_bucket(x):
    """floor(log2(1 + x)) of an int64 x >= 0."""
    v = x + 1
    k = 0
    while v > 1:
        v >>= 1
        k += 1
    return k


@njit(nogil=True, cache=True)
def parse_criteo(buf, int_as_cat, strict, missing, negative, codes,
                 labels, dense, values, bad_line, bad_code):
    """Criteo TSV: label, 13 integer counts, 26 hex categoricals (40 tab-separated columns).

    labels (n,) float32; dense (n, 13) float32 = log1p(max(x, 0)), missing -> 0; values (n, 26 or
    39) uint64: column j of the hex categoricals, ``missing`` when empty; with ``int_as_cat`` columns
    26..38 hold floor(log2(1+x)) of the integers (``missing`` when empty, ``negative`` when x < 0).
    codes = (BAD_COLUMNS, BAD_LABEL, BAD_NUMBER, BAD_HEX).
    """
    n = buf.shape[0]
    pos = 0
    n_lines = 0
    r = 0
    n_bad = 0
    n_blank = 0
    while pos < n:
        end, e = _line_end(buf, pos)
        line = n_lines
        n_lines += 1
        if e == pos:
            n_blank += 1
            pos = end + 1
            continue
        code = 0
        col = 0
        a = pos
        while True:
            b = a
            while b < e and buf[b] != 9:
                b += 1
            if col == 0:
                ok, v = _parse_int(buf, a, b)
                if not ok or (v != 0 and v != 1):
                    code = codes[1]
                    break
                labels[r] = v
            elif col <= 13:
                if b == a:
                    dense[r, col - 1] = 0.0
                    if int_as_cat:
                        values[r, 25 + col] = missing
                else:
                    ok, v = _parse_int(buf, a, b)
                    if not ok:
                        code = codes[2]
                        break
                    dense[r, col - 1] = math.log1p(max(v, 0))
                    if int_as_cat:
                        values[r, 25 + col] = negative if v < 0 else np.uint64(_log2_bucket(v))
            elif col <= 39:
                if b == a:
                    values[r, col - 14] = missing
                else:
                    ok, h = _parse_hex(buf, a, b)
                    if not ok:
                        code = codes[3]
                        break
                    values[r, col - 14] = h
            else:
                code = codes[0]
                break
            col += 1
            if b >= e:
                break
            a = b + 1
        if code == 0 and col != 40:
            code = codes[0]
        pos = end + 1
        if code == 0:
            r += 1
        else:
            if n_bad < bad_line.shape[0]:
                bad_line[n_bad] = line
                bad_code[n_bad] = code
            n_bad += 1
            if strict:
                break
    return n_lines, r, n_bad, n_blank


@njit(nogil=True, cache=True)
def parse_csv(buf, kind, slot, strict, missing, codes, labels, dense, values, bad_line, bad_code):
    """Comma-separated lines without quoting; column c is of ``kind[c]``: 0 label, 1 dense, 2
    categorical, 3 ignored, and goes to column ``slot[c]`` of ``dense``/``values``.

    labels (n,) float32 (1 -> 1, 0 or -1 -> 0); dense (n, D) float32 (empty -> 0, beyond float32's
    range malformed); values (n, F)
    uint64: FNV-1a of the column's bytes (``missing`` when empty).
    codes = (BAD_COLUMNS, BAD_LABEL, BAD_NUMBER).
    """
    n = buf.shape[0]
    n_cols = kind.shape[0]
    pos = 0
    n_lines = 0
    r = 0
    n_bad = 0
    n_blank = 0
    while pos < n:
        end, e = _line_end(buf, pos)
        line = n_lines
        n_lines += 1
        if e == pos:
            n_blank += 1
            pos = end + 1
            continue
        code = 0
        col = 0
        a = pos
        while True:
            b = a
            while b < e and buf[b] != 44:
                b += 1
            if col >= n_cols:
                code = codes[0]
                break
            kd = kind[col]
            if kd == 0:
                ok, v = _parse_float(buf, a, b)
                if not ok or (v != 1.0 and v != 0.0 and v != -1.0):
                    code = codes[1]
                    break
                labels[r] = 1.0 if v == 1.0 else 0.0
            elif kd == 1:
                if b == a:
                    dense[r, slot[col]] = 0.0
                else:
                    ok, v = _parse_float32(buf, a, b)
                    if not ok:
                        code = codes[2]
                        break
                    dense[r, slot[col]] = v
            elif kd == 2:
                values[r, slot[col]] = missing if b == a else _fnv1a(buf, a, b)
            col += 1
            if b >= e:
                break
            a = b + 1
        if code == 0 and col != n_cols:
            code = codes[0]
        pos = end + 1
        if code == 0:
            r += 1
        else:
            if n_bad < bad_line.shape[0]:
                bad_line[n_bad] = line
                bad_code[n_bad] = code
            n_bad += 1
            if strict:
                break
    return n_lines, r, n_bad, n_blank
