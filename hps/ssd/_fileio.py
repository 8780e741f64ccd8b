"""``FileIO``: the file side of an SSD-PS store — writing parameter files and the manifest, reading
header/keys sections, and the block reader behind ``load`` (format: :mod:`hps.ssd._format`).

Every file operation goes through the store's ``Env``. Reads of rows go through a pool of
``io_threads`` threads, each issuing its share of a round's reads in one ``Env.read_many`` call and
checking their blocks in one nogil crc pass, so up to ``io_threads`` reads are in flight and no
read waits for the GIL (``hps.ssd._native`` says why that matters).

Concurrency: thread-safe (the handle cache has its own lock, read buffers are per thread). It holds
no store state: which files exist is the :class:`~hps.ssd._catalog.Catalog`'s business.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..errors import CorruptionError
from . import _format as F
from . import _read_kernels as K
from ._catalog import FileMeta
from ._handles import FdCache
from ._native import CRC32

#: Page-cache policies of ``SSDOptions.page_cache``:
#: "direct": ``O_DIRECT`` reads, and the pages a dump wrote dropped after its fsync (nothing cached);
#: "dontneed": buffered reads without readahead (``POSIX_FADV_RANDOM``) whose pages are dropped once
#: read (``POSIX_FADV_DONTNEED``: the MEM-PS holds those rows now); pages a dump wrote stay cached
#: (rows the MEM-PS just evicted);
#: "keep": plain buffered I/O (the kernel's readahead and caching).
PAGE_CACHE_MODES = ("direct", "dontneed", "keep")   # also hps.config.PAGE_CACHE_MODES (--ssd-page-cache)


class _Reads:
    """The reads of one ``load``, arrays (r,) int64 per read: ``fd`` handle, ``off`` / ``len`` bytes
    in the file, ``step`` its file's block size, ``blk`` its first block's number in the file,
    ``crc0`` where that block's crc is in ``crcs`` (c,) uint32, ``file`` its file's index in
    ``names`` (the files' paths)."""

    __slots__ = ("fd", "off", "len", "step", "blk", "crc0", "crcs", "file", "names")

    def __init__(self, fd, off, ln, step, blk, crc0, crcs, file, names):
        self.fd, self.off, self.len, self.step, self.blk = fd, off, ln, step, blk
        self.crc0, self.crcs, self.file, self.names = crc0, crcs, file, names

    def where(self, i: int) -> str:
        return self.names[int(self.file[i])]


def _first_bad_block(buf, boffs, lens, steps, cstart, want):
    """(j, q) of the first block q of read j whose crc32 differs from ``want[cstart[j] + q]``, or
    (-1, -1): one nogil kernel call (``hps.ssd._native.CRC32``) where available, else Python's."""
    if CRC32 is not None:
        return K.first_bad_block(CRC32, buf, boffs, lens, steps, cstart, want)
    mv = memoryview(buf)
    for j, (b, ln, step, c) in enumerate(zip(boffs.tolist(), lens.tolist(), steps.tolist(), cstart.tolist())):
        for q in range(ln // step):  # pragma: no cover - zlib is always there on POSIX
            if F.crc32(mv[b + q * step:b + (q + 1) * step]) != int(want[c + q]):
                return j, q
    return -1, -1


def _aligned(n: int) -> np.ndarray:
    """(n,) uint8 array whose data starts at a multiple of ROWS_ALIGN (O_DIRECT buffers)."""
    raw = np.empty(n + F.ROWS_ALIGN, dtype=np.uint8)
    off = (-raw.ctypes.data) % F.ROWS_ALIGN
    return raw[off:off + n]


class FileIO:
    """Files of the store at ``path`` (dim, dtype ``code``) through ``env``; ``options``: SSDOptions."""

    def __init__(self, env, path: str, dim: int, code: int, options):
        self.env, self.path, self.dim, self.code = env, path, dim, code
        self.options = options
        self.dtype = F.DTYPE_CODES[code]
        self.row_bytes = dim * self.dtype.itemsize
        mode = options.page_cache
        self._direct = mode == "direct"           # rows read with O_DIRECT
        self._drop = mode != "keep"               # pages read through the cache are dropped after
        self._drop_written = mode == "direct"     # pages a dump wrote are dropped after its fsync
        self._fds = FdCache(env, random=mode == "dontneed")
        self._tls = threading.local()
        self._pool = None
        if options.io_threads > 1:
            self._pool = ThreadPoolExecutor(options.io_threads, thread_name_prefix="hps-ssd-io")

    def p(self, name: str) -> str:
        return os.path.join(self.path, name)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        self._fds.close_all()

    # -- parallelism -------------------------------------------------------------------------------------
    def start(self, fn, n: int):
        """Start fn(0..n-1) in the I/O pool (inline when there is none or n < 2) -> ``wait()``, which
        waits for all of them and then raises the first error."""
        if self._pool is None or n < 2:
            for i in range(n):
                fn(i)
            return lambda: None
        futs = [self._pool.submit(fn, i) for i in range(n)]

        def wait():
            errs = [f.exception() for f in futs]
            for e in errs:
                if e is not None:
                    raise e
        return wait

    # -- writing -----------------------------------------------------------------------------------------
    def write_param(self, seq: int, keys, versions, rows, horizon: int | None = None) -> FileMeta:
        """Write one format-2 parameter file, or a tombstone file (format 3) when ``rows`` is None:
        temp name, fsync, rename into place (directory not fsynced). keys (n,) '<u8', versions (n,)
        '<u8' or None, rows (n, dim) disk dtype, C order, or None; ``horizon``: see ``FileMeta``."""
        n, bb = keys.shape[0], self.options.block_bytes
        flags = F.FLAG_VERSIONS if versions is not None else 0
        if rows is None:
            flags, bb = flags | F.FLAG_TOMBSTONES, 0
            lay = F.Layout(F.FORMAT_TOMBSTONES, n, self.row_bytes, versions is not None)
            crcs = None
        else:
            lay = F.Layout(F.FORMAT_VERSION, n, self.row_bytes, versions is not None, bb)
            crcs = F.block_crcs(rows, bb)
        meta = np.zeros(lay.rows_offset - F.HEADER_SIZE, dtype=np.uint8)
        meta[:8 * n] = keys.view(np.uint8)
        if versions is not None:
            meta[lay.versions_offset - F.HEADER_SIZE:][:8 * n] = versions.view(np.uint8)
        if crcs is not None:
            meta[lay.crcs_offset - F.HEADER_SIZE:][:4 * lay.n_blocks] = crcs.astype("<u4").view(np.uint8)
        header = F.pack_header(self.code, self.dim, flags, seq, n, F.crc32(meta), bb)
        pad = 0 if rows is None else lay.size - lay.rows_offset - n * self.row_bytes
        tmp, final = self.p(F.tmp_name(seq)), self.p(F.param_name(seq))
        env = self.env
        try:
            h = env.open_write(tmp)
            try:
                env.write(h, header)
                env.write(h, meta)
                if rows is not None:
                    env.write(h, rows)
                if pad:
                    env.write(h, bytes(pad))
                env.fsync(h)
                if self._drop_written:
                    env.drop_cache(h)
            finally:
                env.close(h)
            env.rename(tmp, final)
        except BaseException:
            self.unlink_quietly([F.tmp_name(seq)])
            raise
        return FileMeta(seq, lay, crcs, horizon=horizon)

    def write_manifest(self, next_seq: int, entries) -> None:
        """Replace ``MANIFEST`` by one listing ``entries`` ((n, 2) uint64 (seq, size)): write the temp
        file, fsync, rename over ``MANIFEST`` (the caller fsyncs the directory). A failure leaves
        the old manifest in place."""
        tmp = self.p(F.MANIFEST_TMP)
        try:
            self.env.write_file(tmp, F.pack_manifest(next_seq, entries))
            self.env.rename(tmp, self.p(F.MANIFEST_FILE))
        except BaseException:
            self.unlink_quietly([F.MANIFEST_TMP])
            raise

    def unlink_quietly(self, names) -> None:
        for name in names:
            self._fds.drop(self.p(name))
            try:
                self.env.remove(self.p(name))
            except OSError:
                pass

    # -- reading headers and keys ----------------------------------------------------------------------
    def read_range(self, name: str, offset: int, size: int):
        """Bytes [offset, offset + size) of a file, read through the page cache (then dropped)."""
        h = self.env.open_read(self.p(name))
        try:
            buf = bytearray(size)
            got = self.env.read_into(h, offset, buf)
            if self._drop:
                self.env.drop_cache(h, offset, size)
        finally:
            self.env.close(h)
        return buf if got == size else buf[:got]

    def read_meta(self, seq: int, size: int):
        """Read and check a file's header and keys sections -> (Header, keys, versions, crcs).
        ``size``: the file's size (checked against the header)."""
        name = F.param_name(seq)
        where = self.p(name)
        hdr = F.Header(self.read_range(name, 0, F.HEADER_SIZE), where, size)
        if hdr.seq != seq:
            raise CorruptionError(f"{where}: header sequence number {hdr.seq} does not match the name")
        if hdr.dim != self.dim or hdr.code != self.code:
            raise CorruptionError(f"{where}: dim/dtype code {hdr.dim}/{hdr.code} differ from the store's")
        keys, versions, crcs = F.parse_meta(self.read_range(name, 0, hdr.layout.rows_offset), hdr, where)
        return hdr, keys, versions, crcs

    # -- reading rows --------------------------------------------------------------------------------
    def read_rows(self, files: dict, seqs, slots, out, dest) -> int:
        """Fill ``out[dest[i]]`` with row ``slots[i]`` of file ``files[seqs[i]]`` -> bytes read.

        seqs, slots, dest (m,) int64; out (n, dim) of the disk dtype, C order, host. Format-2
        files: only the blocks holding asked rows are read (adjacent blocks in one read of at most
        ``max_read_bytes``, at most ``read_buffer_bytes`` per round), every block checked against its
        crc; format-1 files: read whole, checked. Blocking; raises CorruptionError on a mismatch."""
        if seqs.shape[0] == 0:
            return 0
        order = np.lexsort((slots, seqs))
        seqs, slots, dest = seqs[order], slots[order], dest[order]
        useq, starts = np.unique(seqs, return_index=True)
        flist = [files[s] for s in useq.tolist()]
        v2 = np.array([f.version != F.FORMAT_V1 for f in flist], dtype=np.bool_)
        fidx = np.searchsorted(useq, seqs)
        nread = 0
        bounds = np.append(starts, seqs.shape[0])
        for i in np.flatnonzero(~v2).tolist():     # format 1 (legacy): whole files
            sl = slice(bounds[i], bounds[i + 1])
            nread += self._read_v1(flist[i], slots[sl], out, dest[sl])
        if v2.any():
            m = v2[fidx]
            nread += self._read_blocks([f if v else None for f, v in zip(flist, v2.tolist())],
                                       fidx[m], slots[m], out, dest[m])
        return nread

    def _read_v1(self, f: FileMeta, slots, out, dest) -> int:
        name = F.param_name(f.seq)
        where = self.p(name)
        key = [(where, False)]
        (h,) = self._fds.acquire(key)
        try:
            buf = self._buffer(f.size)
            got = self.env.read_into(h, 0, buf)
            if self._drop:
                self.env.drop_cache(h)
        finally:
            self._fds.release(key)
        hdr = F.Header(buf[:got], where, got)
        if hdr.seq != f.seq or hdr.n_rows != f.n_rows or hdr.dim != self.dim or hdr.code != self.code:
            raise CorruptionError(f"{where}: header does not match the store's index")
        out[dest] = F.parse_rows_v1(buf[:got], hdr, where)[slots]
        return f.size

    def _read_blocks(self, flist, fidx, slots, out, dest) -> int:
        """Format-2 part of :meth:`read_rows` (rows sorted by (file, slot))."""
        o = self.options
        nf = len(flist)
        bb = np.array([f.layout.block_bytes if f else 1 for f in flist], dtype=np.int64)
        roff = np.array([f.layout.rows_offset if f else 0 for f in flist], dtype=np.int64)
        nblk = np.array([f.layout.n_blocks if f else 0 for f in flist], dtype=np.int64)
        base = np.zeros(nf, dtype=np.int64)
        base[1:] = np.cumsum(nblk + 2)[:-1]           # a gap of 2: blocks of two files never join
        rb = self.row_bytes
        s = slots.astype(np.int64) * rb
        b = bb[fidx]
        g0 = base[fidx] + s // b
        g1 = base[fidx] + (s + rb - 1) // b
        pread = self.env.native_pread() if CRC32 is not None and out.flags.c_contiguous else None
        tb = (o.read_buffer_bytes // o.io_threads) // F.ROWS_ALIGN * F.ROWS_ALIGN  # per I/O thread
        if tb < int(bb.max()):
            pread = None
        cap = np.maximum(1, (min(o.max_read_bytes, tb) if pread is not None else o.max_read_bytes) // b)
        m = g0.shape[0]
        run_of_key = np.empty(m, dtype=np.int64)
        run_first = np.empty(m, dtype=np.int64)
        run_last = np.empty(m, dtype=np.int64)
        r = K.plan_runs(g0, g1, cap, run_of_key, run_first, run_last)
        first_key = np.flatnonzero(np.r_[True, run_of_key[1:] != run_of_key[:-1]])
        run_f = fidx[first_key]
        run_off = roff[run_f] + (run_first[:r] - base[run_f]) * bb[run_f]
        run_len = (run_last[:r] - run_first[:r] + 1) * bb[run_f]
        key_in_run = s + roff[fidx] - run_off[run_of_key]
        if pread is not None and int(run_len.max()) <= tb:
            return self._read_fused(pread, tb, flist, fidx, run_f, run_off, run_len, run_first[:r] - base[run_f],
                                    run_of_key, key_in_run, out, dest)
        wstart = np.empty(r + 1, dtype=np.int64)
        nw = K.plan_windows(run_len, o.read_buffer_bytes, wstart)
        keys_to = np.searchsorted(run_of_key, wstart[:nw + 1])
        paths = [(self.p(F.param_name(f.seq)), self._direct) if f else None for f in flist]
        used = sorted({paths[i] for i in np.unique(run_f).tolist()})
        handles = dict(zip(used, self._fds.acquire(used)))
        try:
            rd = self._reads(flist, handles, paths, run_f, run_off, run_len, run_first[:r] - base[run_f])
            for w in range(nw):
                r0, r1 = int(wstart[w]), int(wstart[w + 1])
                boff = np.zeros(r1 - r0, dtype=np.int64)
                np.cumsum(run_len[r0:r1 - 1], out=boff[1:])
                total = int(boff[-1] + run_len[r1 - 1])
                buf = self._buffer(total)
                self._read_window(rd, r0, r1, buf, boff)
                if self._drop and not self._direct:
                    self._drop_pages(handles, paths, run_f[r0:r1], run_off[r0:r1], run_len[r0:r1])
                k0, k1 = int(keys_to[w]), int(keys_to[w + 1])
                isz = self.dtype.itemsize
                elem = (boff[run_of_key[k0:k1] - r0] + key_in_run[k0:k1]) // isz
                flat = buf[:total].view(self.dtype)
                rows = np.lib.stride_tricks.as_strided(flat, shape=(flat.shape[0] - self.dim + 1, self.dim),
                                                       strides=(isz, isz), writeable=False)
                out[dest[k0:k1]] = rows[elem]
        finally:
            self._fds.release(used)
        return int(run_len.sum())

    def _reads(self, flist, handles, paths, run_f, run_off, run_len, blk) -> "_Reads":
        bb = np.array([f.layout.block_bytes if f else 1 for f in flist], dtype=np.int64)
        fd = np.array([handles.get(p, -1) for p in paths], dtype=np.int64)[run_f]
        ncrc = np.array([f.crcs.shape[0] if f else 0 for f in flist], dtype=np.int64)
        crcs = np.concatenate([f.crcs for f in flist if f]).astype(np.uint32, copy=False)
        return _Reads(fd, run_off, run_len, bb[run_f], blk, np.cumsum(ncrc)[run_f] - ncrc[run_f] + blk,
                      crcs, run_f, [p and p[0] for p in paths])

    def _read_fused(self, pread, tb, flist, fidx, run_f, run_off, run_len, blk, run_of_key, key_in_run,
                    out, dest) -> int:
        """:meth:`_read_blocks` without rounds: each of ``io_threads`` I/O threads makes one nogil
        kernel call (``read_scatter``) that reads its share of the reads into its own ``tb``-byte
        buffer, checks their blocks and copies their rows into ``out``, so the threads keep their
        reads in flight from the first to the last, and take the GIL twice per load, not per read.
        REQUIRES: every read <= ``tb`` bytes; ``out`` C order."""
        r = run_f.shape[0]
        paths = [(self.p(F.param_name(f.seq)), self._direct) if f else None for f in flist]
        used = sorted({paths[i] for i in np.unique(run_f).tolist()})
        handles = dict(zip(used, self._fds.acquire(used)))
        try:
            rd = self._reads(flist, handles, paths, run_f, run_off, run_len, blk)
            key_start = np.searchsorted(run_of_key, np.arange(r + 1))
            out8 = out.reshape(-1).view(np.uint8)
            tasks = min(r, self.options.io_threads)
            buf = self._buffer(tasks * tb)
            env = self.env

            def task(t):
                mine = np.arange(t, r, tasks, dtype=np.int64)
                mybuf = buf[t * tb:(t + 1) * tb]
                st = np.empty(3, dtype=np.int64)
                retried = -1
                while True:
                    K.read_scatter(pread, CRC32, mine, rd.fd, rd.off, rd.len, rd.step, rd.crc0, rd.crcs,
                                   mybuf, key_start, key_in_run, dest, out8, self.row_bytes, st)
                    i, what, x = (int(v) for v in st)
                    if what == 2:
                        raise CorruptionError(f"{rd.where(i)}: block {int(rd.blk[i]) + x} checksum "
                                              "mismatch (rows section checksum)")
                    if what == 0:
                        return
                    # an error or EOF: repeat the read through the Env, which raises the OSError
                    ln = int(rd.len[i])
                    g = env.read_into(int(rd.fd[i]), int(rd.off[i]), memoryview(mybuf)[:ln])
                    if g != ln:
                        raise CorruptionError(f"{rd.where(i)}: short read ({g} of {ln} bytes at {rd.off[i]})")
                    if i == retried:
                        raise CorruptionError(f"{rd.where(i)}: the read at {rd.off[i]} keeps failing in the "
                                              "read kernel but not through the Env")
                    retried = i                           # a passing error (EINTR): go on from there
                    mine = mine[np.searchsorted(mine, i):]

            self.start(task, tasks)()
            if self._drop and not self._direct:
                self._drop_pages(handles, paths, run_f, run_off, run_len)
        finally:
            self._fds.release(used)
        return int(run_len.sum())

    def _read_window(self, rd: "_Reads", r0: int, r1: int, buf, boff) -> None:
        """Read reads ``r0:r1`` of ``rd`` into ``buf`` at ``boff`` ((r1 - r0,) int64) and check every
        block's crc: ``io_threads`` tasks (reads interleaved), each one ``Env.read_many`` call and one
        nogil crc pass, so no task takes the GIL per read."""
        n = r1 - r0
        tasks = min(n, self.options.io_threads)
        env = self.env

        def task(t):
            sel = np.arange(r0 + t, r1, tasks)
            bo = boff[sel - r0]
            got = env.read_many(rd.fd[sel], rd.off[sel], rd.len[sel], buf, bo)
            for j in np.flatnonzero(got != rd.len[sel]).tolist():   # an error or EOF: say which
                i = int(sel[j])
                ln = int(rd.len[i])
                g = env.read_into(int(rd.fd[i]), int(rd.off[i]), memoryview(buf)[bo[j]:bo[j] + ln])
                if g != ln:
                    raise CorruptionError(f"{rd.where(i)}: short read ({g} of {ln} bytes at {rd.off[i]})")
            j, q = _first_bad_block(buf, bo, rd.len[sel], rd.step[sel], rd.crc0[sel], rd.crcs)
            if j >= 0:
                i = int(sel[j])
                raise CorruptionError(f"{rd.where(i)}: block {int(rd.blk[i]) + q} checksum mismatch "
                                      "(rows section checksum)")

        self.start(task, tasks)()

    def _drop_pages(self, handles, paths, run_f, run_off, run_len) -> None:
        """Drop the cached pages of these reads, one range per file."""
        for fi in np.unique(run_f).tolist():
            sel = run_f == fi
            lo = int(run_off[sel].min())
            self.env.drop_cache(handles[paths[fi]], lo, int((run_off[sel] + run_len[sel]).max()) - lo)

    def _buffer(self, n: int) -> np.ndarray:
        """This thread's aligned read buffer, grown to at least ``n`` bytes (thread-local: no lock)."""
        buf = getattr(self._tls, "buf", None)
        if buf is None or buf.shape[0] < n:
            buf = self._tls.buf = _aligned(max(n, 1 << 16))
        return buf
