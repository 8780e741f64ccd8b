"""File compaction of the SSD-PS (Appendix E of ``shared/seeds/004``).

Files with more than ``stale_fraction`` stale rows are read, their live rows merged into new files
(new sequence numbers; each row keeps the *version* of its source in the versions section), the index
re-pointed, and the old files deleted. Every file left is then at most ``stale_fraction`` stale (half,
by default), so the rows on disk are at most 2x the live rows (plus the last, partly filled merged
file of each step).

Concurrency: runs under ``_compact_mu``; file I/O happens outside ``_mu``. A row is re-pointed only if
the index still points at its source location under ``_mu`` at commit time, so a dump that rewrote
the key meanwhile keeps its newer value (the merged copy is counted stale). Crash safety: merged files
are durable (fsync, rename, directory fsync) before any old file is deleted; on reopen the versions
make the newest dump win over a merged copy of an older one.
"""

from __future__ import annotations

import numpy as np

from . import _format as F
from ._store import _File, _space_error


def _pick_victims(store, force: bool):
    """REQUIRES: ``_mu`` held. -> files to merge (marked compacting and referenced)."""
    if store._closed:
        return []
    if not force and store._total_rows <= store.options.compact_ratio * len(store._index):
        return []
    frac = store.options.stale_fraction
    victims = [f for f in store._files.values()
               if not f.compacting and f.n_rows > 0 and f.stale > frac * f.n_rows]
    victims.sort(key=lambda f: f.seq)
    for f in victims:
        f.compacting = True
        f.refs += 1
    return victims


def compact(store, force: bool) -> int:
    """Merge the files more than ``stale_fraction`` stale (without ``force``: only once the rows on
    disk pass ``compact_ratio`` x live rows) -> number of files removed. See the module docstring."""
    with store._compact_mu:
        with store._mu:
            victims = _pick_victims(store, force)
        if not victims:
            return 0
        row_bytes = store.dim * store._disk_dtype.itemsize + 16
        budget = max(store.rows_per_file, store.options.compact_batch_bytes // row_bytes)
        removed = 0
        try:
            group, live_est = [], 0
            for i, f in enumerate(victims):
                group.append(f)
                live_est += f.n_rows - f.stale
                if live_est >= budget or i == len(victims) - 1:
                    _merge(store, group)
                    removed += len(group)
                    group, live_est = [], 0
        finally:
            leftover = [f for f in victims if f.compacting]
            with store._mu:
                for f in leftover:
                    f.compacting = False
            store._release(leftover)
        with store._mu:
            store._stats["compactions"] += 1
        return removed


def _merge(store, group) -> None:
    """Merge one group of victims into new files, re-point the index, delete the victims."""
    keys, versions, src, rows = [], [], [], []
    for f in group:
        with store._mu:
            all_stale = f.stale >= f.n_rows
        if all_stale:
            continue
        frows, fkeys, fvers = store._read_file(f, with_keys=True)
        with store._mu:
            store._stats["bytes_read"] += f.size
            loc, found = store._index.lookup(fkeys)
        live = np.flatnonzero(found & (loc[:, 0] == f.seq) & (loc[:, 1] == np.arange(f.n_rows)))
        keys.append(fkeys[live])
        versions.append(fvers[live])
        s = np.empty((live.shape[0], 2), dtype=np.int64)
        s[:, 0] = f.seq
        s[:, 1] = live
        src.append(s)
        rows.append(frows[live])
    if keys:
        keys = np.ascontiguousarray(np.concatenate(keys), dtype="<u8")
        versions = np.ascontiguousarray(np.concatenate(versions), dtype="<u8")
        src = np.concatenate(src)
        rows = np.ascontiguousarray(np.concatenate(rows))
    else:
        keys = np.empty(0, dtype="<u8")
    m, rpf = keys.shape[0], store.rows_per_file
    n_files = -(-m // rpf)
    written: list[_File] = []
    if n_files:
        with store._mu:
            seq0 = store._next_seq
            store._next_seq += n_files
        try:
            for i in range(n_files):
                sl = slice(i * rpf, (i + 1) * rpf)
                written.append(store._write_file(seq0 + i, keys[sl], versions[sl], rows[sl]))
            store._env.fsync_dir(store.path)
        except OSError as e:
            store._unlink_quietly([F.param_name(f.seq) for f in written])
            raise _space_error(e, "compacting") from e
    doomed = []
    with store._mu:
        if m:
            loc, found = store._index.lookup(keys)
            still = found & (loc[:, 0] == src[:, 0]) & (loc[:, 1] == src[:, 1])
            ar = np.arange(m, dtype=np.int64)
            new = np.empty((m, 2), dtype=np.int64)
            new[:, 0] = seq0 + ar // rpf
            new[:, 1] = ar % rpf
            store._add_files(written)
            store._index.assign(keys[still], new[still])
            store._add_stale(new[~still, 0])   # rewritten by a dump meanwhile: the merged copy is stale
        for f in group:
            del store._files[f.seq]
            store._total_rows -= f.n_rows
            f.compacting = False
            f.obsolete = True
            f.refs -= 1
            if f.refs == 0:
                doomed.append(F.param_name(f.seq))
    store._unlink_quietly(doomed)
    if doomed:
        store._env.fsync_dir(store.path)
