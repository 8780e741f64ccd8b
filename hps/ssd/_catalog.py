"""``Catalog``: the in-memory state of an open SSD-PS store, and the only owner of it.

It holds the key index (key -> (file seq, slot), a :class:`~hps._index.KeyIndex`), the file table
(one :class:`FileMeta` per parameter file: stale-row counter, read references, the block crcs),
the next sequence number and the counters. ``SSDStore``, compaction and recovery change it only
through the methods below; none of them does file I/O.

Concurrency: thread-safe. Every method holds the catalog's lock ``_mu`` for O(batch) in-memory work.
``changing()`` serialises the changes of the file set (a dump's or a compaction's manifest switch
and commit): lock order ``changing()`` before ``_mu``. A file that left the file set is deleted only
once no reader holds a reference to it (``release`` returns it).
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
    """One parameter file. ``layout``: its :class:`~hps.ssd._format.Layout`; ``crcs`` (n_blocks,)
    uint32 block crcs (format 2; None for format 1, whose rows crc is in its header). Mutable fields
    (stale, refs, obsolete, compacting) change only under the catalog's lock."""

    __slots__ = ("seq", "layout", "crcs", "stale", "refs", "obsolete", "compacting")

    def __init__(self, seq: int, layout: F.Layout, crcs=None, stale: int = 0):
        self.seq, self.layout, self.crcs = seq, layout, crcs
        self.stale, self.refs, self.obsolete, self.compacting = stale, 0, False, False

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
        self._total_rows = sum(f.n_rows for f in files.values())
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

    def live_mask(self, f: FileMeta, keys) -> np.ndarray:
        """(n,) bool: which rows of ``f`` (``keys`` = its keys section) are the live copy of their key."""
        with self._mu:
            loc, found = self._index.lookup(keys)
        return found & (loc[:, 0] == f.seq) & (loc[:, 1] == np.arange(keys.shape[0]))

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
            self._total_rows += f.n_rows
            self._stats["bytes_written"] += f.size

    def _add_stale(self, fseqs) -> None:
        """REQUIRES: ``_mu`` held."""
        if fseqs.shape[0] == 0:
            return
        useq, counts = np.unique(fseqs, return_counts=True)
        for s, c in zip(useq.tolist(), counts.tolist()):
            self._files[s].stale += c

    def delete(self, keys, path) -> int:
        """Drop ``keys`` from the index; their rows become stale (compaction reclaims them) ->
        keys that were live. REQUIRES: the store's dump lock held (no dump is staged meanwhile)."""
        with self._mu:
            self._check_open(path)
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
            victims = [f for f in self._files.values() if not f.compacting and f.n_rows > 0 and
                       (f.stale > stale_fraction * f.n_rows or f.version == F.FORMAT_V1)]
            victims.sort(key=lambda f: f.seq)
            for f in victims:
                f.compacting = True
                f.refs += 1
            return victims

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
                self._total_rows -= f.n_rows
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
                        live_rows=live, stale_rows=self._total_rows - live, **self._stats)

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
