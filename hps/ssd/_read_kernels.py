"""Kernels of the SSD-PS block reader (``hps.ssd._fileio``). Kernels only.

Blocks carry *global* ids: file ``f``'s block ``b`` is ``base[f] + b``, with a gap of at least 2
between files, so blocks of two files are never adjacent.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(nogil=True, cache=True)
def plan_runs(g0, g1, cap, run_of_key, run_first, run_last):
    """Group rows into reads. ``g0``/``g1`` (m,) int64: first/last global block of each asked row,
    sorted by ``g0``; ``cap`` (m,) int64: the most blocks one read of that row's file may span.
    A row joins the current read when its first block is in it or right after it and the read
    stays within ``cap`` blocks; otherwise it starts a new read. Fills ``run_of_key`` (m,) int64
    and ``run_first``/``run_last`` (>= number of reads,) int64 -> number of reads."""
    r = -1
    for i in range(g0.shape[0]):
        if r < 0 or g0[i] > run_last[r] + 1 or g1[i] - run_first[r] >= cap[i]:
            r += 1
            run_first[r] = g0[i]
            run_last[r] = g1[i]
        elif g1[i] > run_last[r]:
            run_last[r] = g1[i]
        run_of_key[i] = r
    return r + 1


@njit(nogil=True, cache=True)
def plan_windows(run_len, cap, starts):
    """Cut reads into windows of at most ``cap`` bytes (a read longer than ``cap`` is a window of its
    own). ``run_len`` (r,) int64 bytes; fills ``starts`` (>= r + 1,) int64 with the first read of
    each window and a final r -> number of windows."""
    w = 0
    acc = 0
    for i in range(run_len.shape[0]):
        if i == 0 or acc + run_len[i] > cap:
            starts[w] = i
            w += 1
            acc = 0
        acc += run_len[i]
    starts[w] = run_len.shape[0]
    return w


@njit(nogil=True, cache=True)
def pread_many(pread, fds, offs, lens, buf, boffs, got):
    """Issue reads one after another without the GIL: read ``j`` fills ``buf[boffs[j]:][:lens[j]]``
    from ``fds[j]`` at ``offs[j]`` (looping over partial reads). ``pread``: the ctypes pointer of
    ``hps.ssd._native.PREAD``; ``fds``, ``offs``, ``lens``, ``boffs`` (r,) int64; ``buf`` (m,) uint8,
    C order. Fills ``got`` (r,) int64 with the bytes read (fewer at EOF, -1 on an error: the caller
    repeats that read in Python for the errno). Blocking."""
    base = np.intp(buf.ctypes.data)
    for j in range(fds.shape[0]):
        done = 0
        while done < lens[j]:
            n = pread(fds[j], base + boffs[j] + done, lens[j] - done, offs[j] + done)
            if n < 0:
                done = -1
                break
            if n == 0:
                break
            done += n
        got[j] = done


@njit(nogil=True, cache=True)
def first_bad_block(crc32, buf, boffs, lens, steps, cstart, want):
    """Check the blocks of reads: read ``j`` holds ``lens[j] // steps[j]`` blocks of ``steps[j]``
    bytes at ``buf[boffs[j]:]`` whose crc32s must be ``want[cstart[j]:]``. ``crc32``: the ctypes
    pointer of ``hps.ssd._native.CRC32``; ``boffs``, ``lens``, ``steps``, ``cstart`` (r,) int64;
    ``want`` (c,) uint32; ``buf`` (m,) uint8, C order. -> (j, q) of the first mismatching block q
    of read j, or (-1, -1)."""
    base = np.intp(buf.ctypes.data)
    for j in range(boffs.shape[0]):
        step = steps[j]
        for q in range(lens[j] // step):
            if crc32(0, base + boffs[j] + q * step, step) != want[cstart[j] + q]:
                return j, q
    return -1, -1
