"""File compaction of the SSD-PS (Appendix E of ``shared/seeds/004``).

Files with more than ``stale_fraction`` stale rows (and every format-1 file) are merged: their keys
sections are read, the live rows found in the index, read block by block and written into new
format-2 files (new sequence numbers; each row keeps the *version* of its source in the versions
section), the manifest switched, the index re-pointed, and the old files deleted. Every file left
is then at most half stale, so the rows on disk are at most 2x the live rows (plus the last, partly
filled merged file of each step).

Concurrency: ``Compactor.lock`` serialises compactions; file I/O happens outside the catalog's
lock. A row is re-pointed only if the index still points at its source location at commit time,
so a dump that rewrote the key meanwhile keeps its newer value (the merged copy is counted stale).
Crash safety: merged files are durable and listed by the manifest before any old file is deleted;
on reopen the versions make the newest dump win over a merged copy of an older one.
"""

from __future__ import annotations

import threading

import numpy as np

from . import _format as F
from ._store import _space_error, switch_manifest


class Compactor:
    """Compaction of one store: ``catalog`` (the state), ``io`` (FileIO), ``options`` (SSDOptions)."""

    def __init__(self, catalog, io, options, rows_per_file: int):
        self.cat, self.io, self.options, self.rows_per_file = catalog, io, options, rows_per_file
        self.lock = threading.Lock()

    def run(self, force: bool) -> int:
        """Merge the files more than half stale (and format-1 files) -> number of files removed.
        Unless ``force``, only when rows on disk > compact_ratio x live rows."""
        o = self.options
        with self.lock:
            victims = self.cat.pick_victims(force, o.compact_ratio, o.stale_fraction)
            if not victims:
                return 0
            row_bytes = self.io.row_bytes + 16
            budget = max(self.rows_per_file, o.compact_batch_bytes // row_bytes)
            removed, ok = 0, False
            try:
                group, live_est = [], 0
                for i, f in enumerate(victims):
                    group.append(f)
                    live_est += f.n_rows - f.stale
                    if live_est >= budget or i == len(victims) - 1:
                        self._merge(group)
                        removed += len(group)
                        group, live_est = [], 0
                ok = True
            finally:
                self._unlink(self.cat.end_compaction([f for f in victims if f.compacting], ok))
            return removed

    def _unlink(self, seqs) -> None:
        if seqs:
            self.io.unlink_quietly([F.param_name(s) for s in seqs])

    def _live(self, f):
        """-> (keys, versions, src (m, 2) int64, rows) of the live rows of victim ``f``."""
        _, keys, versions, _ = self.io.read_meta(f.seq, f.size)
        live = np.flatnonzero(self.cat.live_mask(f, keys))
        rows = np.empty((live.shape[0], self.io.dim), dtype=self.io.dtype)
        seqs = np.full(live.shape[0], f.seq, dtype=np.int64)
        nread = self.io.read_rows({f.seq: f}, seqs, live, rows, np.arange(live.shape[0], dtype=np.int64))
        self.cat.count("bytes_read", nread + f.layout.rows_offset)
        src = np.empty((live.shape[0], 2), dtype=np.int64)
        src[:, 0] = f.seq
        src[:, 1] = live
        return keys[live], versions[live], src, rows

    def _merge(self, group) -> None:
        """Merge one group of victims into new files, switch the manifest, re-point the index,
        delete the victims."""
        parts = [self._live(f) for f in group if not self.cat.all_stale(f)]
        if parts:
            keys, versions, src, rows = (np.concatenate(c) for c in zip(*parts))
        else:
            keys, versions = np.empty(0, np.uint64), np.empty(0, np.uint64)
            src, rows = np.empty((0, 2), np.int64), np.empty((0, self.io.dim), self.io.dtype)
        keys = np.ascontiguousarray(keys, dtype="<u8")
        versions = np.ascontiguousarray(versions, dtype="<u8")
        m, rpf = keys.shape[0], self.rows_per_file
        n_files = -(-m // rpf)
        seq0 = self.cat.reserve(n_files, self.io.path) if n_files else 0
        written: list = []
        doomed: list = []
        committed: list = []

        def commit():
            doomed.extend(self.cat.commit_merge(group, written, keys, src, seq0, rpf))
            committed.append(True)

        try:
            for i in range(n_files):
                sl = slice(i * rpf, (i + 1) * rpf)
                written.append(self.io.write_param(seq0 + i, keys[sl], versions[sl], rows[sl]))
            if written:
                self.io.env.fsync_dir(self.io.path)
            switch_manifest(self.io, self.cat, written, group, commit)
        except BaseException as e:
            if not committed:    # the manifest does not list the merged files: they go
                self._unlink([f.seq for f in written])
            if isinstance(e, OSError):
                raise _space_error(e, "compacting") from e
            raise
        self._unlink(doomed)
