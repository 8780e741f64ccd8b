"""``SSDStore``: the SSD parameter server (Section 6 and Appendix E of ``shared/seeds/004``).

Rows live in append-only parameter files of whole rows (format: :mod:`hps.ssd._format`). The
:class:`~hps.ssd._catalog.Catalog` owns the in-memory state (key -> (file seq, slot) index, file
table with stale counters); :class:`~hps.ssd._fileio.FileIO` does the file I/O. ``dump`` writes new
files and switches the manifest (:mod:`hps.ssd._commit`, the protocol compaction follows too);
``load`` reads only the blocks holding asked rows, each checked against its crc; compaction
(:mod:`hps.ssd._compaction`) merges files more than ``stale_fraction`` stale.

Concurrency contract
--------------------
``SSDStore`` is thread-safe. The catalog's lock is held only for O(batch) in-memory work, never
across file I/O. ``_dump_mu`` serialises dumps, so versions (sequence numbers) reach the index in
order; the catalog's ``changing()`` serialises manifest switches. Lock order: ``_dump_mu`` /
compaction's lock before ``changing()`` before the catalog's lock. A file is deleted only when no
``load`` holds a reference to it.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass

import numpy as np

from .._checks import positive_int
from .._keys import as_keys, check_rows
from ..errors import InvalidInputError, StoreError
from . import _format as F
from ._commit import publishing, switch_manifest
from ._compaction import Compactor
from ._env import DEFAULT_ENV
from ._fileio import PAGE_CACHE_MODES, FileIO
from ._h5 import export_h5, import_h5
from ._recovery import open_store

log = logging.getLogger("hps.ssd")


@dataclass(frozen=True)
class SSDOptions:
    """Tuning of an :class:`SSDStore`; validated on construction."""

    compact_ratio: float = 1.5        # background compaction runs when rows on disk > ratio x live rows
    stale_fraction: float = 0.5       # compaction merges files with more than this fraction stale
    background: bool = True           # run compaction in a background thread
    compact_interval_s: float = 0.5   # the background thread checks this often (dump also wakes it)
    compact_batch_bytes: int = 64 << 20  # rows merged per compaction step (bounds its memory)
    io_threads: int = 32              # I/O pool: reads in flight per load; files written at once by a dump
    block_bytes: int = 4096           # read/checksum unit of new files (a multiple of 4096)
    max_read_bytes: int = 1 << 20     # adjacent asked blocks are read together, up to this many bytes
    read_buffer_bytes: int = 16 << 20  # rows read per round of a load (per loading thread's buffer)
    page_cache: str = "direct"        # direct: O_DIRECT | dontneed: drop pages once read, keep written ones | keep

    def __post_init__(self):
        if not self.compact_ratio >= 1.0:
            raise InvalidInputError(f"compact_ratio must be >= 1.0, got {self.compact_ratio}")
        if not 0.0 <= self.stale_fraction < 1.0:
            raise InvalidInputError(f"stale_fraction must be in [0, 1), got {self.stale_fraction}")
        if not self.compact_interval_s > 0:
            raise InvalidInputError(f"compact_interval_s must be > 0, got {self.compact_interval_s}")
        if self.compact_batch_bytes < 1 or self.io_threads < 1:
            raise InvalidInputError("compact_batch_bytes and io_threads must be >= 1")
        if self.block_bytes < F.ROWS_ALIGN or self.block_bytes % F.ROWS_ALIGN:
            raise InvalidInputError(f"block_bytes must be a positive multiple of {F.ROWS_ALIGN}, "
                                    f"got {self.block_bytes}")
        if not self.block_bytes <= self.max_read_bytes <= self.read_buffer_bytes:
            raise InvalidInputError("need block_bytes <= max_read_bytes <= read_buffer_bytes, got "
                                    f"{self.block_bytes}, {self.max_read_bytes}, {self.read_buffer_bytes}")
        if self.page_cache not in PAGE_CACHE_MODES:
            raise InvalidInputError(f"page_cache must be one of {', '.join(PAGE_CACHE_MODES)}; "
                                    f"got {self.page_cache!r}")


class SSDStore:
    """The SSD-PS: ``(key uint64) -> row (dim,) of dtype`` in append-only parameter files.

    ``SSDStore(path, dim, dtype=float32, rows_per_file=65536, options=None, env=None)`` creates the
    store (an empty or new directory) or opens an existing one and recovers its index; raises
    :class:`StoreFormatError` when ``path`` is not a store or its dim/dtype differ, and
    :class:`CorruptionError` when an acknowledged file is damaged or missing.

    - ``dump(keys (n,) uint64, rows (n, dim))``: blocks until the rows are durable (files fsynced,
      renamed into place, manifest switched, directory fsynced; a ``ScratchEnv`` skips the fsyncs).
      Duplicate keys in one call: the last wins.
    - ``load(keys (n,) uint64) -> (rows (n, dim) of dtype, found (n,) bool)``: newest rows, zeros
      where missing. Reads only the blocks holding asked rows and checks each block's crc.
    - ``contains(keys (n,) uint64) -> (n,) bool``: which keys have a live row (the index; no file read).
    - ``delete(keys (n,) uint64) -> int``: forget keys, durably (a tombstone file; their rows turn
      stale).
    - ``compact()``: merge every file more than ``stale_fraction`` stale (and rewrite format-1
      files as format 2), and the tombstone files into one; -> number of files removed. Runs by
      itself in a background thread when rows on disk exceed ``compact_ratio`` x live rows. After
      a quiescent ``compact()``: disk rows <= 2 x live rows (+ per-file headers, keys and the last
      block's padding, + 16 B per tombstone still needed).
    - ``export_h5(path)`` / ``import_h5(path)``: the whole store as HDF5 ("keys", "rows").

    Thread-safe (see the module docstring for the locks). One process at a time (advisory lock).
    """

    def __init__(self, path, dim: int, dtype=np.float32, rows_per_file: int = 65536, *,
                 options: SSDOptions | None = None, env=None):
        self.path = os.fspath(path)
        self.dim = positive_int(dim, "dim")
        self.dtype = np.dtype(dtype)
        self.rows_per_file = positive_int(rows_per_file, "rows_per_file")
        self.options = options if options is not None else SSDOptions()
        self._code = F.dtype_code(self.dtype)
        self._disk_dtype = F.DTYPE_CODES[self._code]
        self._dump_mu = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._io = FileIO(env if env is not None else DEFAULT_ENV, self.path, self.dim, self._code,
                          self.options)
        try:
            self._lock_handle, self._cat = open_store(self._io)
        except BaseException:
            self._io.close()
            raise
        self._compactor = Compactor(self._cat, self._io, self.options, self.rows_per_file)
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
            self._cat.reserve(0, self.path)      # raises on a closed store
            return
        r = np.ascontiguousarray(r, dtype=self._disk_dtype)
        k = np.ascontiguousarray(k, dtype="<u8")
        m, rpf = k.shape[0], self.rows_per_file
        n_files = -(-m // rpf)
        io, cat = self._io, self._cat
        with self._dump_mu:
            seq0 = cat.reserve(n_files, self.path)
            written: list = [None] * n_files

            def write_one(i):
                sl = slice(i * rpf, (i + 1) * rpf)
                written[i] = io.write_param(seq0 + i, k[sl], None, r[sl])

            # nothing acknowledged: no file of this dump may survive (unless the manifest lists them)
            with publishing(io, f"dumping {m} rows", lambda: [F.param_name(seq0 + i) for i in range(n_files)]) \
                    as committed:
                wait = io.start(write_one, n_files)  # fsyncs of several files overlap (group commit)
                try:   # while the files are written: stage the keys in the index (invisible to loads)
                    staged = cat.stage(k)
                    own = self._locations(staged.order, seq0)
                finally:
                    wait()
                io.env.fsync_dir(self.path)
                switch_manifest(io, cat, written, (),
                                lambda: committed.append(cat.commit_dump(staged, own, written)))
        if self._thread is not None and cat.needs_compaction(self.options.compact_ratio):
            self._wake.set()

    def delete(self, keys) -> int:
        """Forget ``keys`` (n,) uint64 -> how many were live; blocks until durable. Loads miss them at
        once; a tombstone file of the live ones is written as a dump's files are (a reopened store
        finds none of them, whatever older copies its files keep), and their rows count as stale, so
        compaction reclaims the space. A failure before its manifest switch deletes nothing (one
        after it, of the directory's fsync, leaves the keys deleted)."""
        k = np.unique(as_keys(keys))
        io, cat = self._io, self._cat
        with self._dump_mu:
            gone = k[cat.contains(k, self.path)]
            if gone.shape[0] == 0:
                return 0
            seq = cat.reserve(1, self.path)
            with publishing(io, f"deleting {gone.shape[0]} rows", lambda: [F.param_name(seq)]) as committed:
                f = io.write_param(seq, np.ascontiguousarray(gone, dtype="<u8"), None, None)
                io.env.fsync_dir(self.path)
                switch_manifest(io, cat, [f], (), lambda: committed.append(cat.commit_delete(f, gone)))
        if self._thread is not None and cat.needs_compaction(self.options.compact_ratio):
            self._wake.set()
        return committed[0]

    def load(self, keys):
        """-> (rows (n, dim) of dtype, found (n,) bool): newest version of each key, zeros where missing."""
        k = as_keys(keys)
        out = np.zeros((k.shape[0], self.dim), dtype=self._disk_dtype)
        found = self._read_into(k, out, None)
        return out.astype(self.dtype, copy=False), found

    def load_into(self, keys, out, at) -> np.ndarray:
        """Read the newest version of each found key straight into ``out[at[i]]`` -> found (n,) bool;
        rows of keys not found are left as they were. keys (n,) uint64; out (m, dim) of the store's
        dtype, C order; at (n,) int64 rows of ``out``. No copy besides the read when the store's
        dtype is its disk dtype."""
        k = as_keys(keys)
        at = np.asarray(at, dtype=np.int64)
        if not isinstance(out, np.ndarray) or not out.flags.writeable:
            raise InvalidInputError(f"load_into needs out a writable NumPy array, got {type(out).__name__}")
        if at.shape != k.shape or out.ndim != 2 or out.shape[1] != self.dim or out.dtype != self.dtype:
            raise InvalidInputError(f"load_into needs at of shape {k.shape} and out of (m, {self.dim}) "
                                    f"{self.dtype}; got at {at.shape}, out {out.shape} {out.dtype}")
        if k.shape[0] and (int(at.min()) < 0 or int(at.max()) >= out.shape[0]):  # the read path writes unchecked
            raise InvalidInputError(f"load_into needs at in [0, {out.shape[0]}) (rows of out), got "
                                    f"{int(at.min())}..{int(at.max())}")
        if out.dtype == self._disk_dtype and out.flags.c_contiguous:
            return self._read_into(k, out, at)
        tmp = np.zeros((k.shape[0], self.dim), dtype=self._disk_dtype)
        found = self._read_into(k, tmp, None)
        out[at[found]] = tmp[found]
        return found

    def _read_into(self, k, out, at) -> np.ndarray:
        """out[at[i]] (out[i] when ``at`` is None) = row of found key k[i] -> found."""
        loc, found, files = self._cat.locate(k, self.path)
        nread = 0
        try:
            pos = np.flatnonzero(found)
            nread = self._io.read_rows(files, loc[pos, 0], loc[pos, 1], out, pos if at is None else at[pos])
        finally:
            self._unlink(self._cat.release(files.values(), nread))
        return found

    def contains(self, keys) -> np.ndarray:
        """-> (n,) bool: which of ``keys`` (n,) uint64 the store holds a live row of. Reads no file
        (the in-memory index only)."""
        return self._cat.contains(as_keys(keys), self.path)

    def iter_rows(self, chunk_rows: int = 1 << 16):
        """Yield (keys (m,) uint64, rows (m, dim)) chunks of every live row, file by file: a snapshot
        of the dumps acknowledged before the call (files stay readable until the generator ends)."""
        chunk_rows = positive_int(chunk_rows, "chunk_rows")
        keys, loc, files = self._cat.snapshot(self.path)
        nread = 0
        try:
            order = np.lexsort((loc[:, 1], loc[:, 0]))
            for a in range(0, keys.shape[0], chunk_rows):
                sel = order[a:a + chunk_rows]
                out = np.empty((sel.shape[0], self.dim), dtype=self._disk_dtype)
                nread += self._io.read_rows(files, loc[sel, 0], loc[sel, 1], out,
                                            np.arange(sel.shape[0], dtype=np.int64))
                yield keys[sel], out.astype(self.dtype, copy=False)
        finally:
            self._unlink(self._cat.release(files.values(), nread))

    def compact(self) -> int:
        """Merge every file more than ``stale_fraction`` stale now, and the tombstone files into one
        -> number of files removed. Raises StoreError on a closed store, as the other data calls do."""
        self._cat.reserve(0, self.path)   # raises on a closed store
        return self._compactor.run(force=True)

    def index_bytes(self, n_more: int = 0) -> int:
        """DRAM of the key index and the block crc tables now; with ``n_more``, the most they hold at
        once while ``n_more`` more rows are dumped, in calls of any size, rebuilds of the index
        included (a dump reserves index room for every row it writes, and a compaction merging
        meanwhile for its own batch of rows). What a caller that shares a memory budget with this
        store counts for it. Thread-safe."""
        if not n_more:
            return self._cat.index_bytes()
        block_rows = max(1, self.options.block_bytes // self._io.row_bytes)
        return self._cat.index_bytes(int(n_more) + self._compactor.rows_cap(), block_rows)

    def index_room(self) -> int:
        """Rows that can be dumped before the key index rebuilds (into arrays twice the size: see
        :meth:`index_bytes`), less a compaction's batch that may be merging meanwhile."""
        return max(0, self._cat.index_room() - self._compactor.rows_cap())

    def stats(self) -> dict:
        """Counters: files (tombstone files too), disk_bytes, live_rows, stale_rows, tombstones (deleted
        keys' entries on disk), bytes_read, bytes_written, compactions, recovered_rows, recovered_files,
        discarded_files, compaction_errors, index_bytes (DRAM of the key index and block crc tables)."""
        return dict(self._cat.stats(), index_bytes=self._cat.index_bytes())

    def export_h5(self, path) -> int:
        """Write every live (key, row) to HDF5 datasets "keys" (n,) uint64 and "rows" (n, dim),
        attrs dim and dtype -> n. Consistent with the dumps acknowledged before the call."""
        return export_h5(self, path)

    def import_h5(self, path) -> int:
        """Dump every (key, row) of an HDF5 file written by ``export_h5`` -> number of rows."""
        return import_h5(self, path)

    def close(self) -> None:
        """Stop the background compaction and release the store. Idempotent."""
        if not self._cat.close():
            return
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        with self._compactor.lock, self._dump_mu:
            self._io.close()
            if self._lock_handle is not None:
                self._io.env.unlock(self._lock_handle)
                self._lock_handle = None

    def __len__(self) -> int:
        return len(self._cat)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"SSDStore({self.path!r}, dim={self.dim}, dtype={self.dtype}, rows_per_file={self.rows_per_file})"

    # -- internals ---------------------------------------------------------------------------------
    def _unlink(self, seqs) -> None:
        if seqs:
            self._io.unlink_quietly([F.param_name(s) for s in seqs])

    def _locations(self, order, seq0: int):
        """(n, 2) int64 (file seq, slot) of rows ``order`` of a dump whose first file is ``seq0``."""
        own = np.empty((order.shape[0], 2), dtype=np.int64)
        np.floor_divide(order, self.rows_per_file, out=own[:, 0])
        own[:, 0] += seq0
        np.remainder(order, self.rows_per_file, out=own[:, 1])
        return own

    def _background(self) -> None:
        while True:
            self._wake.wait(self.options.compact_interval_s)
            self._wake.clear()
            if self._cat.closed:
                return
            try:
                self._compactor.run(force=False)
            except Exception as e:  # keep serving; the next round retries
                if isinstance(e, StoreError) and self._cat.closed:  # close() stopped the round midway
                    return
                self._cat.count("compaction_errors")
                log.warning("hps.ssd: background compaction of %s failed: %r", self.path, e)
