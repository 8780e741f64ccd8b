"""File compaction of the SSD-PS (Appendix E of ``shared/seeds/004``).

Files with more than ``stale_fraction`` stale rows (and every format-1 file) are merged: their keys
sections are read, the live rows found in the index, read block by block and written into new
format-2 files (new sequence numbers; each row keeps the *version* of its source in the versions
section), the manifest switched, the index re-pointed, and the old files deleted. Every file left
is then at most ``stale_fraction`` stale (half, by default), so the rows on disk are at most 2x the
live rows (plus the last, partly filled merged file of each step).

Tombstone files (one per ``delete``) are merged into one, keeping the newest entry of each key that
still hides an older row from a reopen (the key has no live row, and rows older than the entry are on
disk): a background round once there are ``TOMBSTONE_FILES`` of them, ``compact()`` whenever there
are any. A tombstone merge holds every entry it reads (16 B each) at once; one row file older than the
deletes keeps their entries (it may hold copies of the keys) until compaction merges it.

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
from ._commit import publishing, switch_manifest

#: Tombstone files (one per ``delete``) a background compaction lets pile up before it merges them.
TOMBSTONE_FILES = 8


class Compactor:
    """Compaction of one store: ``catalog`` (the state), ``io`` (FileIO), ``options`` (SSDOptions)."""

    def __init__(self, catalog, io, options, rows_per_file: int):
        self.cat, self.io, self.options, self.rows_per_file = catalog, io, options, rows_per_file
        self.lock = threading.Lock()

    def run(self, force: bool) -> int:
        """Merge the files more than ``stale_fraction`` stale (and format-1 files) -> number of files removed.
        Unless ``force``, only when rows on disk > compact_ratio x live rows. Then the tombstone files
        are merged into one (``force``: any; else once there are ``TOMBSTONE_FILES``)."""
        o = self.options
        with self.lock:
            removed = 0
            victims = self.cat.pick_victims(force, o.compact_ratio, o.stale_fraction)
            if victims:
                ok = False
                try:
                    group, live_est = [], 0
                    for i, f in enumerate(victims):
                        group.append(f)
                        live_est += f.n_rows - f.stale
                        if live_est >= self.rows_cap() or i == len(victims) - 1:
                            self._merge(group)
                            removed += len(group)
                            group, live_est = [], 0
                    ok = True
                finally:
                    self._unlink(self.cat.end_compaction([f for f in victims if f.compacting], ok))
            tombs = self.cat.pick_tombstones(1 if force else TOMBSTONE_FILES)
            if tombs:
                merged = None
                try:
                    merged = self._merge_tombstones(tombs)
                finally:   # a merge that found nothing to drop is no compaction
                    self._unlink(self.cat.end_compaction([f for f in tombs if f.compacting], bool(merged)))
                removed += merged or 0
            return removed

    def rows_cap(self) -> int:
        """Rows per merged file, per read of a victim, and live rows per merge step."""
        return max(1, min(self.rows_per_file, self.options.compact_batch_bytes // (self.io.row_bytes + 16)))

    def _unlink(self, seqs) -> None:
        if seqs:
            self.io.unlink_quietly([F.param_name(s) for s in seqs])

    def _live_chunks(self, f):
        """-> (horizon of these rows (see ``FileMeta``), an iterator of (keys, versions, src (m, 2)
        int64, rows) of the live rows of victim ``f``, at most ``rows_cap()`` rows at a time (only
        their blocks are read))."""
        _, keys, versions, _ = self.io.read_meta(f.seq, f.size)
        self.cat.count("bytes_read", f.layout.rows_offset)
        live, horizon = self.cat.live_mask(f, keys)
        return horizon, self._read_live(f, keys, versions, np.flatnonzero(live))

    def _read_live(self, f, keys, versions, live):
        cap = self.rows_cap()
        for a in range(0, live.shape[0], cap):
            sl = live[a:a + cap]
            rows = np.empty((sl.shape[0], self.io.dim), dtype=self.io.dtype)
            seqs = np.full(sl.shape[0], f.seq, dtype=np.int64)
            self.cat.count("bytes_read", self.io.read_rows({f.seq: f}, seqs, sl, rows,
                                                           np.arange(sl.shape[0], dtype=np.int64)))
            src = np.empty((sl.shape[0], 2), dtype=np.int64)
            src[:, 0] = f.seq
            src[:, 1] = sl
            yield keys[sl], versions[sl], src, rows

    def _merge_tombstones(self, group) -> int:
        """Rewrite the tombstone files ``group`` as one of the entries still needed (the newest of
        each key; see ``Catalog.tombstones_needed``), or none -> files removed (len(group) - written),
        None when there was nothing to drop (nothing rewritten)."""
        keys, versions = [], []
        for f in group:
            _, k, v, _ = self.io.read_meta(f.seq, f.size)
            self.cat.count("bytes_read", f.size)
            keys.append(k)
            versions.append(v)
        k, v = np.concatenate(keys), np.concatenate(versions)
        order = np.lexsort((v, k))
        k, v = k[order], v[order]
        newest = np.r_[k[1:] != k[:-1], True] if k.shape[0] else np.zeros(0, np.bool_)
        keep = np.flatnonzero(newest)
        keep = keep[self.cat.tombstones_needed(k[keep], v[keep])]
        if len(group) == 1 and keep.shape[0] == k.shape[0]:
            return None                                # nothing to drop: leave the file as it is
        written: list = []
        no = (np.empty(0, np.uint64), np.empty((0, 2), np.int64), np.empty((0, 2), np.int64))
        # a failure after the commit leaves the files it took out of the manifest: the rename may not be
        # durable (the directory's fsync failed), so a crash could bring them back; the next open removes them
        with publishing(self.io, "compacting tombstones", lambda: [F.param_name(f.seq) for f in written]) \
                as committed:
            if keep.shape[0]:
                seq = self.cat.reserve(1, self.io.path)
                written.append(self.io.write_param(seq, np.ascontiguousarray(k[keep], dtype="<u8"),
                                                   np.ascontiguousarray(v[keep], dtype="<u8"), None))
                self.io.env.fsync_dir(self.io.path)
            switch_manifest(self.io, self.cat, written, group,
                            lambda: committed.append(self.cat.commit_merge(group, written, *no)))
        self._unlink(committed[0])
        return len(group) - len(written)

    def _merge(self, group) -> None:
        """Merge one group of victims into new files (written as their rows arrive, so at most two
        files' worth of rows is held), switch the manifest, re-point the index, delete the victims."""
        cap = self.rows_cap()
        written, keys, src, new = [], [], [], []
        pending, n_pending = [], 0
        horizons: list = []

        def flush():
            nonlocal pending, n_pending
            k, v, s, r = (np.concatenate(c) for c in zip(*pending))
            horizon = min(horizons)
            for a in range(0, k.shape[0], cap):
                b = min(k.shape[0], a + cap)
                seq = self.cat.reserve(1, self.io.path)
                written.append(self.io.write_param(seq, np.ascontiguousarray(k[a:b], dtype="<u8"),
                                                   np.ascontiguousarray(v[a:b], dtype="<u8"), r[a:b], horizon))
                loc = np.empty((b - a, 2), dtype=np.int64)
                loc[:, 0] = seq
                loc[:, 1] = np.arange(b - a)
                keys.append(k[a:b])
                src.append(s[a:b])
                new.append(loc)
            pending, n_pending = [], 0
            horizons.clear()

        def commit():
            cat_keys = np.concatenate(keys) if keys else np.empty(0, np.uint64)
            cat_src = np.concatenate(src) if src else np.empty((0, 2), np.int64)
            cat_new = np.concatenate(new) if new else np.empty((0, 2), np.int64)
            committed.append(self.cat.commit_merge(group, written, cat_keys, cat_src, cat_new))  # (the with's)

        # the manifest does not list the merged files until the commit: they go when it fails before
        with publishing(self.io, "compacting", lambda: [F.param_name(f.seq) for f in written]) as committed:
            for f in group:
                if self.cat.all_stale(f):
                    continue
                horizon, chunks = self._live_chunks(f)
                for piece in chunks:
                    horizons.append(horizon)
                    pending.append(piece)
                    n_pending += piece[0].shape[0]
                    if n_pending >= cap:
                        flush()
            if n_pending:
                flush()
            if written:
                self.io.env.fsync_dir(self.io.path)
            switch_manifest(self.io, self.cat, written, group, commit)
        self._unlink(committed[0])
