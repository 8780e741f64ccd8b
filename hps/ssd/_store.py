"""``SSDStore``: the SSD parameter server (Section 6 and Appendix E of ``shared/seeds/004``).

Rows live in append-only parameter files of whole rows (format: :mod:`hps.ssd._format`). An in-memory
:class:`~hps._index.KeyIndex` maps key -> (file seq, slot); each file keeps a stale-row counter.
``dump`` writes new files; ``load`` reads every file that holds a requested key once, whole;
compaction (:mod:`hps.ssd._compaction`) merges files that are more than half stale.

Concurrency contract
--------------------
``SSDStore`` is thread-safe. ``_mu`` guards the index and the file table (held only for O(batch)
in-memory work, never across file I/O). ``_dump_mu`` serialises dumps, so versions (sequence numbers)
reach the index in order. ``_compact_mu`` serialises compactions. Lock order: ``_compact_mu`` /
``_dump_mu`` before ``_mu``. A file is deleted only when no ``load`` holds a reference to it.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .._index import KeyIndex
from .._keys import as_keys, check_rows
from ..errors import CorruptionError, DiskFullError, InvalidInputError, StoreError
from . import _format as F
from ._env import DEFAULT_ENV

log = logging.getLogger("hps.ssd")

_SPACE_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


@dataclass(frozen=True)
class SSDOptions:
    """Tuning of an :class:`SSDStore`; validated on construction."""

    compact_ratio: float = 1.5        # background compaction runs when rows on disk > ratio x live rows
    stale_fraction: float = 0.5       # compaction merges files with more than this fraction stale
    background: bool = True           # run compaction in a background thread
    compact_interval_s: float = 0.5   # the background thread checks this often (dump also wakes it)
    compact_batch_bytes: int = 64 << 20  # rows merged per compaction step (bounds its memory)
    io_threads: int = 4               # files written+fsynced by one dump / read by one load in parallel

    def __post_init__(self):
        if not self.compact_ratio >= 1.0:
            raise InvalidInputError(f"compact_ratio must be >= 1.0, got {self.compact_ratio}")
        if not 0.0 <= self.stale_fraction < 1.0:
            raise InvalidInputError(f"stale_fraction must be in [0, 1), got {self.stale_fraction}")
        if not self.compact_interval_s > 0:
            raise InvalidInputError(f"compact_interval_s must be > 0, got {self.compact_interval_s}")
        if self.compact_batch_bytes < 1 or self.io_threads < 1:
            raise InvalidInputError("compact_batch_bytes and io_threads must be >= 1")


class _FdCache:
    """Open read handles of parameter files, keyed by path: the idle ones beyond ``cap`` are closed
    (least recently used first); a handle in use is never closed. Saves an open/close per read.
    Thread-safe (its own lock)."""

    def __init__(self, env, cap: int = 256):
        self._env, self._cap = env, cap
        self._mu = threading.Lock()
        self._open: OrderedDict = OrderedDict()  # path -> [handle, users]

    @contextmanager
    def use(self, path: str):
        with self._mu:
            entry = self._open.get(path)
            if entry is None:
                entry = self._open[path] = [self._env.open_read(path), 0]
            entry[1] += 1
            self._open.move_to_end(path)
        try:
            yield entry[0]
        finally:
            with self._mu:
                entry[1] -= 1
                self._trim()

    def _trim(self) -> None:
        """REQUIRES: ``_mu`` held."""
        while len(self._open) > self._cap:
            idle = next((p for p, e in self._open.items() if e[1] == 0), None)
            if idle is None:
                return
            self._env.close(self._open.pop(idle)[0])

    def drop(self, path: str) -> None:
        """Close the handle of a file about to be deleted (no reader holds it: refs are 0)."""
        with self._mu:
            entry = self._open.get(path)
            if entry is not None and entry[1] == 0:
                del self._open[path]
                self._env.close(entry[0])

    def close_all(self) -> None:
        with self._mu:
            for handle, _ in self._open.values():
                self._env.close(handle)
            self._open.clear()


class _File:
    """In-memory metadata of one parameter file. REQUIRES: ``SSDStore._mu`` held to change fields."""

    __slots__ = ("seq", "n_rows", "size", "stale", "refs", "obsolete", "compacting")

    def __init__(self, seq: int, n_rows: int, size: int, stale: int = 0):
        self.seq, self.n_rows, self.size, self.stale = seq, n_rows, size, stale
        self.refs = 0            # loads/compactions reading the file now
        self.obsolete = False    # merged away: delete when refs drops to 0
        self.compacting = False  # chosen by a running compaction


def _space_error(e: OSError, what: str) -> OSError:
    if isinstance(e, DiskFullError) or e.errno not in _SPACE_ERRNOS:
        return e
    return DiskFullError(e.errno, f"no space left on the device while {what}; everything acknowledged "
                                  "before stays readable")


class SSDStore:
    """SSD parameter server: batch ``dump``/``load`` of (n, dim) rows keyed by uint64 keys.

    ``SSDStore(path, dim, dtype=np.float32, rows_per_file=65536, *, options=None, env=None)``
    creates the store directory ``path``, or opens an existing store and recovers its index from the
    files (newest version of each key wins; ``stats()`` reports what was recovered). Raises
    :class:`StoreFormatError` when ``path`` is not a store or its dim/dtype differ, and
    :class:`CorruptionError` when an acknowledged file is damaged.

    - ``dump(keys (n,) uint64, rows (n, dim))``: blocks until the rows are durable (files fsynced,
      renamed into place, directory fsynced; a ``ScratchEnv`` skips the fsyncs). Duplicate keys in
      one call: the last wins.
    - ``load(keys (n,) uint64) -> (rows (n, dim) of dtype, found (n,) bool)``: newest rows, zeros
      where missing. Reads each file holding a requested key once, whole, and checks its checksum.
    - ``compact()``: merge every file more than ``stale_fraction`` stale; -> number of files removed.
      Runs by itself in a background thread when rows on disk exceed ``compact_ratio`` x live rows.
      After a quiescent ``compact()``: disk rows <= 2 x live rows (+ per-file headers).
    - ``export_h5(path)`` / ``import_h5(path)``: the whole store as HDF5 ("keys", "rows").

    Thread-safe (see the module docstring for the locks). One process at a time (advisory lock).
    """

    def __init__(self, path, dim: int, dtype=np.float32, rows_per_file: int = 65536, *,
                 options: SSDOptions | None = None, env=None):
        self.path = os.fspath(path)
        self.dim = int(dim)
        self.dtype = np.dtype(dtype)
        self.rows_per_file = int(rows_per_file)
        self.options = options if options is not None else SSDOptions()
        self._env = env if env is not None else DEFAULT_ENV
        if self.dim < 1:
            raise InvalidInputError(f"dim must be >= 1, got {dim}")
        if self.rows_per_file < 1:
            raise InvalidInputError(f"rows_per_file must be >= 1, got {rows_per_file}")
        self._code = F.dtype_code(self.dtype)
        self._disk_dtype = F.DTYPE_CODES[self._code]
        self._mu = threading.Lock()
        self._dump_mu = threading.Lock()
        self._compact_mu = threading.Lock()
        self._tls = threading.local()    # per-thread read buffers of load()
        self._fds = _FdCache(self._env)
        self._wake = threading.Event()
        self._closed = True
        self._lock_handle = None
        self._thread = None
        self._files: dict[int, _File] = {}
        self._index = KeyIndex(width=2)
        self._next_seq = 1
        self._total_rows = 0
        self._stats = dict(bytes_read=0, bytes_written=0, compactions=0, recovered_rows=0,
                           recovered_files=0, discarded_files=0, compaction_errors=0)
        self._pool = None
        self._open()
        self._closed = False
        if self.options.io_threads > 1:
            from concurrent.futures import ThreadPoolExecutor
            self._pool = ThreadPoolExecutor(self.options.io_threads, thread_name_prefix="hps-ssd-io")
        if self.options.background:
            self._thread = threading.Thread(target=self._background, name="hps-ssd-compaction",
                                            daemon=True)
            self._thread.start()

    # -- public API --------------------------------------------------------------------------------
    def dump(self, keys, rows) -> None:
        """Write rows as new files; blocks until durable. keys (n,) uint64; rows (n, dim)."""
        k = as_keys(keys)
        r = check_rows(rows, k.shape[0], self.dim, self.dtype, "rows")
        if k.shape[0] == 0:
            self._check_open()
            return
        r = np.ascontiguousarray(r, dtype=self._disk_dtype)
        k = np.ascontiguousarray(k, dtype="<u8")
        m, rpf = k.shape[0], self.rows_per_file
        n_files = -(-m // rpf)
        with self._dump_mu:
            with self._mu:
                self._check_open()
                seq0 = self._next_seq
                self._next_seq += n_files
            written: list = [None] * n_files

            def write_one(i):
                sl = slice(i * rpf, (i + 1) * rpf)
                written[i] = self._write_file(seq0 + i, k[sl], None, r[sl])

            try:
                wait = self._start(write_one, n_files)  # fsyncs of several files overlap (group commit)
                try:   # while the files are written: stage the keys in the index (invisible to loads)
                    with self._mu:
                        staged = self._index.stage(k)
                    own = self._locations(staged.order, seq0)
                finally:
                    wait()
                self._env.fsync_dir(self.path)
            except BaseException as e:   # nothing acknowledged: no file of this dump may survive
                self._unlink_quietly([F.param_name(seq0 + i) for i in range(n_files)])
                if isinstance(e, OSError):
                    raise _space_error(e, f"dumping {m} rows") from e
                raise
            with self._mu:
                self._commit_dump(staged, own, written)
        if self._thread is not None and self._needs_compaction():
            self._wake.set()

    def load(self, keys):
        """-> (rows (n, dim) of dtype, found (n,) bool): newest version of each key, zeros where missing."""
        k = as_keys(keys)
        n = k.shape[0]
        out = np.zeros((n, self.dim), dtype=self.dtype)
        with self._mu:
            self._check_open()
            if n == 0:
                return out, np.zeros(0, dtype=np.bool_)
            loc, found = self._index.lookup(k)
            pos = np.flatnonzero(found)
            fseq = loc[pos, 0]
            order = np.argsort(fseq, kind="stable")
            pos, fseq, slots = pos[order], fseq[order], loc[pos[order], 1]
            useq, starts = np.unique(fseq, return_index=True)
            files = [self._files[int(s)] for s in useq]
            for f in files:
                f.refs += 1
        bounds = np.append(starts, pos.shape[0])

        def read_one(i):
            rows = self._read_rows(files[i], scratch=True)  # copied out below, before the next read
            sl = slice(bounds[i], bounds[i + 1])
            out[pos[sl]] = rows[slots[sl]]

        try:
            self._map(read_one, len(files))
        finally:
            self._release(files, count_read=True)
        return out, found

    def compact(self) -> int:
        """Merge every file more than ``stale_fraction`` stale now -> number of files removed."""
        from ._compaction import compact
        return compact(self, force=True)

    def stats(self) -> dict:
        """Counters: files, disk_bytes, live_rows, stale_rows, bytes_read, bytes_written, compactions,
        recovered_rows, recovered_files, discarded_files, compaction_errors."""
        with self._mu:
            live = len(self._index)
            return dict(files=len(self._files), disk_bytes=sum(f.size for f in self._files.values()),
                        live_rows=live, stale_rows=self._total_rows - live, **self._stats)

    def export_h5(self, path) -> int:
        """Write every live (key, row) to HDF5 datasets "keys" (n,) uint64 and "rows" (n, dim),
        attrs dim and dtype -> n. Consistent with the dumps acknowledged before the call."""
        from ._h5 import export_h5
        return export_h5(self, path)

    def import_h5(self, path) -> int:
        """Dump every (key, row) of an HDF5 file written by ``export_h5`` -> number of rows."""
        from ._h5 import import_h5
        return import_h5(self, path)

    def close(self) -> None:
        """Stop the background compaction and release the store. Idempotent."""
        with self._mu:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        with self._compact_mu, self._dump_mu:
            if self._pool is not None:
                self._pool.shutdown()
            self._fds.close_all()
            if self._lock_handle is not None:
                self._env.unlock(self._lock_handle)
                self._lock_handle = None

    def __len__(self) -> int:
        with self._mu:
            return len(self._index)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"SSDStore({self.path!r}, dim={self.dim}, dtype={self.dtype}, rows_per_file={self.rows_per_file})"

    # -- internals ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        """REQUIRES: ``_mu`` held (or construction)."""
        if self._closed:
            raise StoreError(f"store {self.path!r} is closed")

    def _p(self, name: str) -> str:
        return os.path.join(self.path, name)

    def _map(self, fn, n: int) -> None:
        """Run fn(0..n-1), in the I/O pool when there is one; waits for all, then raises the first error."""
        self._start(fn, n)()

    def _start(self, fn, n: int):
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

    def _write_file(self, seq: int, keys, versions, rows) -> _File:
        """Write one parameter file: temp name, fsync, rename into place (directory not fsynced)."""
        n = keys.shape[0]
        kcrc = F.crc32(keys)
        if versions is not None:
            kcrc = F.crc32(versions, kcrc)
        flags = F.FLAG_VERSIONS if versions is not None else 0
        header = F.pack_header(self._code, self.dim, flags, seq, n, kcrc, F.crc32(rows))
        tmp, final = self._p(F.tmp_name(seq)), self._p(F.param_name(seq))
        size = F.layout(n, self.dim, self._disk_dtype.itemsize, versions is not None)[2]
        try:
            h = self._env.open_write(tmp)
            try:
                self._env.write(h, header)
                self._env.write(h, keys)
                if versions is not None:
                    self._env.write(h, versions)
                self._env.write(h, rows)
                self._env.fsync(h)
            finally:
                self._env.close(h)
            self._env.rename(tmp, final)
        except BaseException:
            self._unlink_quietly([F.tmp_name(seq)])
            raise
        return _File(seq, n, size)   # the caller counts bytes_written when it commits the file

    def _unlink_quietly(self, names) -> None:
        for name in names:
            self._fds.drop(self._p(name))
            try:
                self._env.remove(self._p(name))
            except OSError:
                pass

    def _locations(self, order, seq0: int):
        """(n, 2) int64 (file seq, slot) of rows ``order`` of a dump whose first file is ``seq0``."""
        own = np.empty((order.shape[0], 2), dtype=np.int64)
        np.floor_divide(order, self.rows_per_file, out=own[:, 0])
        own[:, 0] += seq0
        np.remainder(order, self.rows_per_file, out=own[:, 1])
        return own

    def _commit_dump(self, staged, own, written) -> None:
        """Point the staged keys at the new files (``own``: their locations, in ``staged.order``).
        REQUIRES: ``_mu`` held; files durable."""
        self._add_files(written)
        # every location a key leaves is stale now: its previous file, or, for a key repeated in
        # this dump, the slot its earlier occurrence took here
        _, old, had = self._index.publish(staged, own)
        self._add_stale(old[had, 0])

    def _add_files(self, written) -> None:
        """Enter durable new files into the file table. REQUIRES: ``_mu`` held."""
        for f in written:
            self._files[f.seq] = f
            self._total_rows += f.n_rows
            self._stats["bytes_written"] += f.size

    def _add_stale(self, fseqs) -> None:
        """REQUIRES: ``_mu`` held."""
        if fseqs.shape[0] == 0:
            return
        useq, counts = np.unique(fseqs, return_counts=True)
        for s, c in zip(useq.tolist(), counts.tolist()):
            self._files[s].stale += c

    def _read_file(self, f: _File, with_keys: bool = False, scratch: bool = False):
        """Read a whole file and check it -> (rows view, keys, versions) (keys None unless asked).
        ``scratch``: read into this thread's reused buffer; the rows view is valid only until this
        thread's next scratch read."""
        where = self._p(F.param_name(f.seq))
        with self._fds.use(where) as handle:
            buf = self._env.pread(handle, 0, f.size, into=self._scratch if scratch else None)
        hdr = F.Header(buf, where, len(buf))
        if hdr.seq != f.seq or hdr.n_rows != f.n_rows or hdr.dim != self.dim or hdr.code != self._code:
            raise CorruptionError(f"{where}: header does not match the store's index")
        rows = F.parse_rows(buf, hdr, where)
        keys = versions = None
        if with_keys:
            keys, versions = F.parse_keys(buf, hdr, where)
        return rows, keys, versions

    def _read_rows(self, f: _File, scratch: bool = False):
        return self._read_file(f, scratch=scratch)[0]

    def _scratch(self, n: int):
        """This thread's read buffer, grown to at least ``n`` bytes (thread-local: no lock)."""
        buf = getattr(self._tls, "buf", None)
        if buf is None or buf.shape[0] < n:
            buf = self._tls.buf = np.empty(max(n, 1 << 20), dtype=np.uint8)
        return buf

    def _release(self, files, count_read: bool = False) -> None:
        """Drop references taken under ``_mu``; delete files merged away meanwhile."""
        doomed = []
        with self._mu:
            for f in files:
                f.refs -= 1
                if count_read:
                    self._stats["bytes_read"] += f.size
                if f.obsolete and f.refs == 0:
                    doomed.append(F.param_name(f.seq))
        if doomed:
            self._unlink_quietly(doomed)

    def _needs_compaction(self) -> bool:
        with self._mu:
            return self._total_rows > self.options.compact_ratio * len(self._index)

    def _background(self) -> None:
        from ._compaction import compact
        while True:
            self._wake.wait(self.options.compact_interval_s)
            self._wake.clear()
            if self._closed:
                return
            try:
                compact(self, force=False)
            except Exception as e:  # keep serving; the next round retries
                with self._mu:
                    self._stats["compaction_errors"] += 1
                log.warning("hps.ssd: background compaction of %s failed: %r", self.path, e)

    # -- open / recovery ---------------------------------------------------------------------------
    def _open(self) -> None:
        from ._recovery import open_store
        open_store(self)
