"""Kernels of the SSD-PS block reader (``hps.ssd._fileio``). Kernels only.

Blocks carry *global* ids: file ``f``'s block ``b`` is ``base[f] + b``, with a gap of at least 2
between files, so blocks of two files are never adjacent.
"""

from __future__ import annotations

import numpy as np

from .._jit import njit


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


@njit(nogil=True, cache=True)
def read_scatter(pread, crc32, mine, fds, offs, lens, steps, crc0, want, buf, key_start, key_off,
                 dest, out, row_bytes, status):
    """One I/O thread's share of a load, without the GIL: for each read ``r`` of ``mine`` (m,) int64,
    in order, read ``lens[r]`` bytes of ``fds[r]`` at ``offs[r]`` into ``buf`` (its own buffer, >= the
    longest read, C order), check its blocks (``steps[r]`` bytes each) against ``want[crc0[r]:]``, and
    copy the ``row_bytes`` bytes of each of its rows ``k`` in ``key_start[r]:key_start[r + 1]`` from
    ``buf[key_off[k]:]`` to ``out[dest[k] * row_bytes:]`` (``out`` (n * row_bytes,) uint8). ``pread``
    / ``crc32``: the ctypes pointers of ``hps.ssd._native``; other arrays int64 except ``want``
    (c,) uint32. Stops at the first failure: fills ``status`` (3,) int64 with (read, 1, bytes got)
    for a short read or an error (-1), (read, 2, block) for a crc mismatch, else (-1, 0, 0)."""
    base = np.intp(buf.ctypes.data)
    for j in range(mine.shape[0]):
        r = mine[j]
        done = 0
        while done < lens[r]:
            n = pread(fds[r], base + done, lens[r] - done, offs[r] + done)
            if n <= 0:
                if n < 0:
                    done = -1
                break
            done += n
        if done != lens[r]:
            status[0], status[1], status[2] = r, 1, done
            return
        step = steps[r]
        for q in range(lens[r] // step):
            if crc32(0, base + q * step, step) != want[crc0[r] + q]:
                status[0], status[1], status[2] = r, 2, q
                return
        for k in range(key_start[r], key_start[r + 1]):
            src = key_off[k]
            dst = dest[k] * row_bytes
            for b in range(row_bytes):
                out[dst + b] = buf[src + b]
    status[0], status[1], status[2] = -1, 0, 0
