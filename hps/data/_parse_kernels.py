"""Numba kernels that parse one chunk of text lines (kernels only: no I/O, no globals).

Common contract of the ``parse_*`` kernels:

- ``buf`` (m,) uint8: whole lines, each ending in ``\\n`` (a ``\\r`` before it is ignored).
- Valid lines are written to rows ``0 .. n_ok-1`` of the output arrays, in order.
- Malformed lines are skipped; the first ``bad_line.shape[0]`` of them are recorded as the 0-based
  line index within ``buf`` (``bad_line``, int64) and a reason code (``bad_code``, int32; codes are
  passed in as arguments and named in ``_chunks``). Blank lines are neither examples nor malformed.
- With ``strict`` the kernel stops right after the first malformed line.
- Returns ``(n_lines, n_ok, n_bad, n_blank)``; ``n_lines`` counts the lines consumed.
Blocking, single-threaded, ``nogil`` (pipeline threads may parse in parallel).
"""

from __future__ import annotations

import math

import numpy as np

from .._hashing import mix64
from .._jit import njit

_TAB = 9
_NL = 10
_CR = 13
_SPACE = 32
_COMMA = 44
_COLON = 58


@njit(nogil=True, cache=True, inline="always")
def _line_end(buf, pos):
    """(end, e): index of the line's ``\\n`` and the end of its content (a trailing ``\\r`` cut)."""
    end = pos
    while buf[end] != 10:
        end += 1
    e = end
    if e > pos and buf[e - 1] == 13:
        e -= 1
    return end, e


@njit(nogil=True, cache=True, inline="always")
def blank_line(buf, pos):
    """Bytes of the blank line starting at buf[pos] (1 for ``\\n``, 2 for ``\\r\\n``), 0 if it is not blank."""
    c = buf[pos]
    if c == 10:
        return 1
    return 2 if c == 13 and buf[pos + 1] == 10 else 0


@njit(nogil=True, cache=True, inline="always")
def record_bad(bad_line, bad_code, n_bad, line, code):
    """Records malformed line ``line`` (its reason ``code``) while there is room; returns n_bad + 1."""
    if n_bad < bad_line.shape[0]:
        bad_line[n_bad] = line
        bad_code[n_bad] = code
    return n_bad + 1


@njit(nogil=True, cache=True, inline="always")
def _parse_int(buf, a, b):
    """(ok, int64 value) of an optional sign and 1-18 decimal digits filling buf[a:b]."""
    i = a
    neg = False
    if i < b and (buf[i] == 45 or buf[i] == 43):
        neg = buf[i] == 45
        i += 1
    if i >= b or b - i > 18:
        return False, np.int64(0)
    v = np.int64(0)
    while i < b:
        c = buf[i]
        if c < 48 or c > 57:
            return False, np.int64(0)
        v = v * 10 + (c - 48)
        i += 1
    return True, -v if neg else v


@njit(nogil=True, cache=True, inline="always")
def _parse_uint(buf, a, b):
    """(ok, uint64 value) of 1-19 decimal digits filling buf[a:b]."""
    if a >= b or b - a > 19:
        return False, np.uint64(0)
    v = np.uint64(0)
    for i in range(a, b):
        c = buf[i]
        if c < 48 or c > 57:
            return False, np.uint64(0)
        v = v * np.uint64(10) + np.uint64(c - 48)
    return True, v


@njit(nogil=True, cache=True, inline="always")
def _parse_float(buf, a, b):
    """(ok, float64 value) of a decimal number (sign, digits, '.', exponent) filling buf[a:b].

    NaN, inf and overflowing numbers are not ok."""
    i = a
    neg = False
    if i < b and (buf[i] == 45 or buf[i] == 43):
        neg = buf[i] == 45
        i += 1
    mant = 0.0
    nd = 0
    exp10 = 0
    while i < b and 48 <= buf[i] <= 57:
        mant = mant * 10.0 + (buf[i] - 48)
        nd += 1
        i += 1
    if i < b and buf[i] == 46:
        i += 1
        while i < b and 48 <= buf[i] <= 57:
            mant = mant * 10.0 + (buf[i] - 48)
            nd += 1
            exp10 -= 1
            i += 1
    if nd == 0:
        return False, 0.0
    if i < b and (buf[i] == 101 or buf[i] == 69):
        i += 1
        eneg = False
        if i < b and (buf[i] == 45 or buf[i] == 43):
            eneg = buf[i] == 45
            i += 1
        ne = 0
        ev = 0
        while i < b and 48 <= buf[i] <= 57:
            if ev < 100000:
                ev = ev * 10 + (buf[i] - 48)
            ne += 1
            i += 1
        if ne == 0:
            return False, 0.0
        exp10 += -ev if eneg else ev
    if i != b:
        return False, 0.0
    if mant == 0.0:
        v = 0.0
    elif exp10 >= 0:
        v = mant * 10.0 ** exp10
    else:
        v = mant / 10.0 ** (-exp10)
    if not math.isfinite(v):
        return False, 0.0
    return True, -v if neg else v


@njit(nogil=True, cache=True, inline="always")
def _parse_float32(buf, a, b):
    """(ok, float64 value) like ``_parse_float``, and not ok when the value overflows float32 (its
    magnitude rounds to inf: above 3.4028235677973366e38, FLT_MAX plus half an ulp)."""
    ok, v = _parse_float(buf, a, b)
    if ok and abs(v) >= 3.4028235677973366e38:
        return False, 0.0
    return ok, v


@njit(nogil=True, cache=True, inline="always")
def _fnv1a(buf, a, b):
    """64-bit FNV-1a hash of the bytes buf[a:b]."""
    h = np.uint64(0xCBF29CE484222325)
    for i in range(a, b):
        h = (h ^ np.uint64(buf[i])) * np.uint64(0x100000001B3)
    return h


@njit(nogil=True, cache=True)
def parse_libsvm(buf, strict, codes, labels, offsets, idx, val, pos_in_line, bad_line, bad_code):
    """libsvm/libFM: ``label idx:val idx:val …`` separated by spaces or tabs.

    Labels 1 -> 1, 0 or -1 -> 0; a value beyond float32's range is malformed. labels (n,) float32;
    offsets (n+1,) int64 (CSR); idx (nnz,) uint64;
    val (nnz,) float32; pos_in_line (nnz,) int32: 0-based position of the feature on its line.
    Output sizes: n >= lines in buf, nnz >= ':' in buf. codes = (BAD_LABEL, BAD_NUMBER, BAD_FEATURE).
    """
    n = buf.shape[0]
    pos = 0
    n_lines = 0
    r = 0
    nnz = 0
    n_bad = 0
    n_blank = 0
    offsets[0] = 0
    while pos < n:
        end, e = _line_end(buf, pos)
        line = n_lines
        n_lines += 1
        a = pos
        while a < e and (buf[a] == 32 or buf[a] == 9):
            a += 1
        if a == e:
            n_blank += 1
            pos = end + 1
            continue
        code = 0
        k = 0
        tok = 0
        start = nnz
        while a < e:
            b = a
            while b < e and buf[b] != 32 and buf[b] != 9:
                b += 1
            if tok == 0:
                ok, v = _parse_float(buf, a, b)
                if not ok or (v != 1.0 and v != 0.0 and v != -1.0):
                    code = codes[0]
                    break
                labels[r] = 1.0 if v == 1.0 else 0.0
            else:
                c = a
                while c < b and buf[c] != 58:
                    c += 1
                if c == b:
                    code = codes[2]
                    break
                ok, iv = _parse_uint(buf, a, c)
                if not ok:
                    code = codes[2]
                    break
                ok, fv = _parse_float32(buf, c + 1, b)
                if not ok:
                    code = codes[1]
                    break
                idx[nnz] = iv
                val[nnz] = fv
                pos_in_line[nnz] = k
                nnz += 1
                k += 1
            tok += 1
            a = b
            while a < e and (buf[a] == 32 or buf[a] == 9):
                a += 1
        pos = end + 1
        if code == 0:
            r += 1
            offsets[r] = nnz
        else:
            nnz = start
            n_bad = record_bad(bad_line, bad_code, n_bad, line, code)
            if strict:
                break
    return n_lines, r, n_bad, n_blank


@njit(nogil=True, cache=True)
def parse_csv(buf, kind, slot, strict, missing, codes, shift, labels, dense, keys, bad_line, bad_code):
    """Comma-separated lines without quoting; column c is of ``kind[c]``: 0 label, 1 dense, 2
    categorical, 3 ignored, and goes to column ``slot[c]`` of ``dense``/``keys``.

    labels (n,) float32 (1 -> 1, 0 or -1 -> 0); dense (n, D) float32 (empty -> 0, beyond float32's
    range malformed); keys (n, F) uint64: ``(j << shift) | mix64(v) >> (64 - shift)`` (``make_keys``)
    of field j = slot, v the FNV-1a hash of the column's bytes (``missing`` when empty), hashed as
    the column is scanned (one pass). codes = (BAD_COLUMNS, BAD_LABEL, BAD_NUMBER).
    """
    n = buf.shape[0]
    n_cols = kind.shape[0]
    sh = np.uint64(shift)
    low = np.uint64(64 - shift)
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
        col = 0
        i = pos
        while True:
            if col >= n_cols:
                code = codes[0]
                break
            kd = kind[col]
            a = i
            if kd == 2:
                h = np.uint64(0xCBF29CE484222325)
                while True:
                    c = buf[i]
                    if c == 44 or c == 10 or (c == 13 and buf[i + 1] == 10):
                        break
                    h = (h ^ np.uint64(c)) * np.uint64(0x100000001B3)
                    i += 1
                keys[r, slot[col]] = (np.uint64(slot[col]) << sh) | (mix64(missing if i == a else h) >> low)
            else:
                while True:
                    c = buf[i]
                    if c == 44 or c == 10 or (c == 13 and buf[i + 1] == 10):
                        break
                    i += 1
                if kd == 0:
                    ok, v = _parse_float(buf, a, i)
                    if not ok or (v != 1.0 and v != 0.0 and v != -1.0):
                        code = codes[1]
                        break
                    labels[r] = 1.0 if v == 1.0 else 0.0
                elif kd == 1:
                    if i == a:
                        dense[r, slot[col]] = 0.0
                    else:
                        ok, v = _parse_float32(buf, a, i)
                        if not ok:
                            code = codes[2]
                            break
                        dense[r, slot[col]] = v
            col += 1
            if buf[i] != 44:
                break
            i += 1
        if code == 0 and col != n_cols:
            code = codes[0]
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


@njit(nogil=True, cache=True)
def hash_strings(data, offsets, valid, missing, shift, keys, col):
    """Arrow string/binary column -> the keys of field ``col``: ``keys[i, col]`` = ``(col << shift) |
    mix64(v) >> (64 - shift)`` (``make_keys``) of v = the FNV-1a hash of the bytes
    ``data[offsets[i]:offsets[i + 1]]`` (as ``parse_csv`` hashes a CSV column), ``missing`` when the
    entry is null (``valid[i]`` False) or empty. data (b,) uint8; offsets (n+1,) int64 (Arrow's,
    absolute into data); valid (n,) bool; keys (n, F) uint64."""
    sh = np.uint64(shift)
    low = np.uint64(64 - shift)
    top = np.uint64(col) << sh
    for i in range(offsets.shape[0] - 1):
        a = offsets[i]
        b = offsets[i + 1]
        keys[i, col] = top | (mix64(_fnv1a(data, a, b) if valid[i] and b > a else missing) >> low)
