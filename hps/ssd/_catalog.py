"""``Catalog``: the in-memory state of an open SSD-PS store, and the only owner of it.

It holds the key index (key -> (file seq, slot), a :class:`~hps._index.KeyIndex`), the file table
(one :class:`FileMeta` per parameter or tombstone file: stale-row counter, read references, the
block crcs), the next sequence number and the counters. ``SSDStore``, compaction and recovery change it only
through the methods below; none of them does file I/O.

Concurrency: thread-safe. Every method holds the catalog's lock ``_mu`` for O(batch) in-memory work.
``changing()`` serialises the changes of the file set (a dump's, a delete's or a compaction's manifest
switch and commit): lock order ``changing()`` before ``_mu``. A file that left the file set is deleted
only once no reader holds a reference to it (``release`` returns it).
"""

from __future__ import annotations

import threading

import numpy as np

from .._index import KeyIndex
from ..errors import StoreError
from . import _format as F

#: Keys an empty store's key index has room for before its first rebuild (57 KiB of slots). The memory
#: plan projects the index's growth from this size (``hps.train._budget.index_bytes_for``).
INDEX_START_KEYS = 1024


class FileMeta:
    """One parameter or tombstone file. ``layout``: its :class:`~hps.ssd._format.Layout`; ``crcs``
    (n_blocks,) uint32 block crcs (format 2; None for format 1, whose rows crc is in its header, and
    for tombstone files); ``horizon``: no row of the file is an older copy of a key deleted before
    this version (a dump's file: its seq; a merged file: the catalog's ``delete_horizon`` when its
    rows were found live; a file read on open: its lowest row version). Mutable fields (stale,
    refs, obsolete, compacting) change only under the catalog's lock."""

    __slots__ = ("seq", "layout", "crcs", "horizon", "stale", "refs", "obsolete", "compacting")

    def __init__(self, seq: int, layout: F.Layout, crcs=None, stale: int = 0, horizon: int | None = None):
        self.seq, self.layout, self.crcs = seq, layout, crcs
        self.horizon = seq if horizon is None else horizon
        self.stale, self.refs, self.obsolete, self.compacting = stale, 0, False, False

    @property
    def tombstones(self) -> bool:
        return self.layout.tombstones

    @property
    def n_rows(self) -> int:
        return self.layout.n_rows

    @property
    def size(self) -> int:
        return self.layout.size

    @property
    def version(self) -> int:
        return self.layout.version


class Catalog:
    """See the module docstring. ``index``: KeyIndex(width=2) of (seq, slot); ``files``: the file table."""

    def __init__(self, index: KeyIndex, files: dict, next_seq: int, stats: dict):
        self._mu = threading.Lock()
        self._change_mu = threading.Lock()
        self._index = index
        self._files = files
        self._next_seq = next_seq
        self._delete_horizon = next_seq   # every delete of a lower sequence number is committed
        self._total_rows = sum(f.n_rows for f in files.values() if not f.tombstones)   # rows on disk
        self._stats = dict(bytes_read=0, bytes_written=0, compactions=0, recovered_rows=0,
                           recovered_files=0, discarded_files=0, compaction_errors=0)
        self._stats.update(stats)
        self._closed = False

    # -- life ------------------------------------------------------------------------------------------
    def close(self) -> bool:
        """Refuse every later call -> False when it was closed already."""
        with self._mu:
            was, self._closed = self._closed, True
            return not was

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self, path) -> None:
        """REQUIRES: ``_mu`` held."""
        if self._closed:
            raise StoreError(f"store {path!r} is closed")

    def changing(self):
        """Context manager serialising file-set changes (manifest switch + commit)."""
        return self._change_mu

    # -- reads -----------------------------------------------------------------------------------------
    def locate(self, keys, path):
        """-> (loc (n, 2) int64 (seq, slot), found (n,) bool, files {seq: FileMeta}), with a read
        reference taken on each file of a found key (drop them with :meth:`release`)."""
        with self._mu:
            self._check_open(path)
            loc, found = self._index.lookup(keys)
            useq = np.unique(loc[found, 0])
            files = {s: self._files[s] for s in useq.tolist()}
            for f in files.values():
                f.refs += 1
        return loc, found, files

    def contains(self, keys, path) -> np.ndarray:
        """(n,) bool: which ``keys`` have a live row (the index alone: no file is referenced or read)."""
        with self._mu:
            self._check_open(path)
            return self._index.lookup(keys)[1]

    def snapshot(self, path):
        """-> (keys (m,) uint64, loc (m, 2) int64, files {seq: FileMeta}) of every live row, with
        references taken (for export)."""
        with self._mu:
            self._check_open(path)
            keys, loc = self._index.items()
            files = {s: self._files[s] for s in np.unique(loc[:, 0]).tolist()}
            for f in files.values():
                f.refs += 1
        return keys, loc, files

    def release(self, files, bytes_read: int = 0) -> list[int]:
        """Drop references -> sequence numbers of files that left the file set and are no longer
        read (the caller deletes them)."""
        doomed = []
        with self._mu:
            self._stats["bytes_read"] += int(bytes_read)
            for f in files:
                f.refs -= 1
                if f.obsolete and f.refs == 0:
                    doomed.append(f.seq)
        return doomed

    def live_mask(self, f: FileMeta, keys):
        """-> ((n,) bool: which rows of ``f`` (``keys`` = its keys section) are the live copy of their
        key, the horizon of a file of those rows: every delete before it was committed)."""
        with self._mu:
            loc, found = self._index.lookup(keys)
            horizon = self._delete_horizon
        return found & (loc[:, 0] == f.seq) & (loc[:, 1] == np.arange(keys.shape[0])), horizon

    # -- writes ----------------------------------------------------------------------------------------
    def reserve(self, n_files: int, path) -> int:
        """Take ``n_files`` consecutive sequence numbers -> the first."""
        with self._mu:
            self._check_open(path)
            seq0 = self._next_seq
            self._next_seq += n_files
            return seq0

    def stage(self, keys):
        """Stage a dump's keys in the index (invisible to lookups until ``commit_dump``)."""
        with self._mu:
            return self._index.stage(keys)

    def manifest(self, add=(), remove=()):
        """-> (next_seq, entries (n, 2) uint64 (seq, size)) of the file set with ``add`` (FileMetas)
        entered and ``remove`` left out. REQUIRES: ``changing()`` held."""
        with self._mu:
            gone = {f.seq for f in remove}
            entries = [(s, f.size) for s, f in self._files.items() if s not in gone]
            entries += [(f.seq, f.size) for f in add]
            return self._next_seq, np.array(sorted(entries), dtype=np.uint64).reshape(-1, 2)

    def commit_dump(self, staged, own, written) -> None:
        """Enter the durable files ``written`` and point the staged keys at ``own`` ((n, 2) locations in
        ``staged.order``). REQUIRES: ``changing()`` held, files and manifest durable."""
        with self._mu:
            self._add_files(written)
            # every location a key leaves is stale now: its previous file, or, for a key repeated in
            # this dump, the slot its earlier occurrence took here
            _, old, had = self._index.publish(staged, own)
            self._add_stale(old[had, 0])

    def _add_files(self, written) -> None:
        """REQUIRES: ``_mu`` held."""
        for f in written:
            self._files[f.seq] = f
            self._total_rows += 0 if f.tombstones else f.n_rows
            self._stats["bytes_written"] += f.size

    def _add_stale(self, fseqs) -> None:
        """REQUIRES: ``_mu`` held."""
        if fseqs.shape[0] == 0:
            return
        useq, counts = np.unique(fseqs, return_counts=True)
        for s, c in zip(useq.tolist(), counts.tolist()):
            self._files[s].stale += c

    def commit_delete(self, tombstones: FileMeta, keys) -> int:
        """Enter the durable tombstone file of ``keys`` and drop them from the index; their rows become
        stale (compaction reclaims them) -> keys that were live. REQUIRES: ``changing()`` and the
        store's dump lock held (no dump is staged meanwhile), the file and manifest durable."""
        with self._mu:
            self._add_files([tombstones])
            self._delete_horizon = tombstones.seq + 1   # deletes commit in order (the dump lock)
            loc, found = self._index.lookup(keys)
            if found.any():
                self._index.erase(keys[found])
                self._add_stale(loc[found, 0])
            return int(found.sum())

    # -- compaction ----------------------------------------------------------------------------------
    def needs_compaction(self, ratio: float) -> bool:
        with self._mu:
            return self._total_rows > ratio * len(self._index)

    def pick_victims(self, force: bool, ratio: float, stale_fraction: float) -> list[FileMeta]:
        """Files to merge, marked compacting and referenced: every file more than ``stale_fraction``
        stale, and every format-1 file (rewritten as format 2). Unless ``force``, only when rows on
        disk > ``ratio`` x live rows."""
        with self._mu:
            if self._closed:
                return []
            if not force and self._total_rows <= ratio * len(self._index):
                return []
            victims = [f for f in self._files.values() if not f.compacting and f.n_rows > 0 and not f.tombstones
                       and (f.stale > stale_fraction * f.n_rows or f.version == F.FORMAT_V1)]
            victims.sort(key=lambda f: f.seq)
            for f in victims:
                f.compacting = True
                f.refs += 1
            return victims

    def pick_tombstones(self, min_files: int) -> list[FileMeta]:
        """The tombstone files, marked compacting and referenced, when there are at least ``min_files``."""
        with self._mu:
            tombs = [f for f in self._files.values() if f.tombstones and not f.compacting]
            if self._closed or len(tombs) < max(1, min_files):
                return []
            for f in tombs:
                f.compacting = True
                f.refs += 1
            return sorted(tombs, key=lambda f: f.seq)

    def tombstones_needed(self, keys, versions) -> np.ndarray:
        """(n,) bool: which tombstone entries (key, version) may still hide a row on disk from a
        reopen: the key has no live row (a live one is newer than every tombstone of its key) and a
        row file's ``horizon`` is not after the entry (the file may hold an older copy of the key).
        REQUIRES: no row file is being merged (the compaction's lock held)."""
        with self._mu:
            horizon = min((f.horizon for f in self._files.values() if not f.tombstones), default=None)
            if horizon is None:
                return np.zeros(keys.shape[0], dtype=np.bool_)
            return ~self._index.lookup(keys)[1] & (versions >= horizon)

    def all_stale(self, f: FileMeta) -> bool:
        with self._mu:
            return f.stale >= f.n_rows

    def commit_merge(self, group, written, keys, src, new) -> list[int]:
        """Enter merged files, re-point each key whose index entry still is its source location
        ``src`` ((m, 2) int64) to its merged location ``new`` ((m, 2) int64), retire ``group`` ->
        files to delete now. REQUIRES: ``changing()`` held, merged files and manifest durable."""
        doomed = []
        with self._mu:
            self._add_files(written)
            if keys.shape[0]:
                loc, found = self._index.lookup(keys)
                still = found & (loc[:, 0] == src[:, 0]) & (loc[:, 1] == src[:, 1])
                self._index.assign(keys[still], new[still])
                self._add_stale(new[~still, 0])   # rewritten by a dump meanwhile: the merged copy is stale
            for f in group:
                del self._files[f.seq]
                self._total_rows -= 0 if f.tombstones else f.n_rows
                f.compacting = False
                f.obsolete = True
                f.refs -= 1
                if f.refs == 0:
                    doomed.append(f.seq)
        return doomed

    def end_compaction(self, leftover, ok: bool) -> list[int]:
        """Unmark victims not merged -> files to delete (see :meth:`release`); counts a compaction."""
        with self._mu:
            for f in leftover:
                f.compacting = False
            if ok:
                self._stats["compactions"] += 1
        return self.release(leftover)

    def count(self, key: str, n: int = 1) -> None:
        with self._mu:
            self._stats[key] += n

    # -- introspection -------------------------------------------------------------------------------
    def stats(self) -> dict:
        with self._mu:
            live = len(self._index)
            return dict(files=len(self._files), disk_bytes=sum(f.size for f in self._files.values()),
                        live_rows=live, stale_rows=self._total_rows - live,
                        tombstones=sum(f.n_rows for f in self._files.values() if f.tombstones), **self._stats)

    def index_bytes(self, n_more: int = 0, block_rows: int = 1) -> int:
        """DRAM held by the key index and the block crc tables (grows with the table); with
        ``n_more``, the most they hold at once while ``n_more`` more rows are written, in calls of
        any size (4 B of crc per ``block_rows`` of them, the index as :meth:`KeyIndex.peak_bytes`
        says)."""
        with self._mu:
            crcs = sum(f.crcs.nbytes for f in self._files.values() if f.crcs is not None)
            if not n_more:
                return self._index.nbytes + crcs
            return (self._index.peak_bytes(n_more) + crcs
                    + 4 * -(-int(n_more) // int(block_rows)))

    def index_room(self) -> int:
        """Rows that can be written before the key index rebuilds."""
        with self._mu:
            return self._index.room

    def __len__(self) -> int:
        with self._mu:
            return len(self._index)
