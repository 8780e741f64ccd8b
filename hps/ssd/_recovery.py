"""Creating and opening a store: the descriptor check and the index rebuild (crash recovery).

Open = take the ``LOCK`` -> check ``STORE`` (dim, dtype, version; written when the store is new) ->
read ``MANIFEST``: a listed file that is missing or of another size raises CorruptionError naming
it -> delete temp files and ``.param`` files the manifest does not list (writes whose manifest switch
never happened, hence never acknowledged) -> read every listed file's header and keys section
(checksummed) -> for each key keep the entry with the highest (version, file seq, slot), and the
key only when that entry is a row, not a tombstone -> per-file stale counters. A format-1 store (no
manifest) takes the files its directory holds, then gets a manifest and a format-2 descriptor.
"""

from __future__ import annotations

import logging

import numpy as np

from .._index import KeyIndex
from ..errors import CorruptionError, StoreError, StoreFormatError, StoreLockedError
from . import _format as F
from ._catalog import INDEX_START_KEYS, Catalog, FileMeta

log = logging.getLogger("hps.ssd")

#: What a directory may hold besides a STORE and still be taken as a new store (left by a crash
#: while the store was being created).
_NEW_STORE_LEFTOVERS = {F.LOCK_FILE, F.STORE_TMP, F.MANIFEST_FILE, F.MANIFEST_TMP}


def open_store(io):
    """Open or create the store of ``io`` (a FileIO) -> (lock handle, Catalog). The ``LOCK`` is taken
    before the descriptor is written or trusted, so two processes creating one store cannot
    interleave: the loser gets StoreLockedError (or StoreFormatError when the winner's store has
    another dim/dtype), never half a descriptor."""
    env, path = io.env, io.path
    if env.exists(path) and not env.isdir(path):
        raise StoreFormatError(f"{path!r} is not an hps SSD store (it is not a directory)")
    if not env.exists(path):
        env.mkdir(path)
    if F.STORE_FILE not in env.listdir(path):
        _check_empty(env.listdir(path), path)     # before the LOCK: never a file in a foreign directory
    try:
        lock = env.lock(io.p(F.LOCK_FILE))
    except BlockingIOError as e:
        raise StoreLockedError(f"store {path!r} is open in another process ({e.strerror}); close it "
                               "there or use another path") from e
    except OSError as e:
        raise StoreError(f"cannot lock store {path!r}: {e.strerror or e}") from e
    try:
        return lock, _open_locked(io)
    except BaseException:
        env.unlock(lock)
        raise


def _check_empty(names, path) -> None:
    if set(names) - _NEW_STORE_LEFTOVERS:
        raise StoreFormatError(f"{path!r} is not an hps SSD store (no {F.STORE_FILE} file, and the "
                               "directory is not empty)")


def _open_locked(io) -> Catalog:
    """REQUIRES: the LOCK held."""
    env, path = io.env, io.path
    names = set(env.listdir(path))
    if F.STORE_FILE not in names:              # a new store: its manifest first, then its descriptor
        _check_empty(names, path)
        io.write_manifest(1, np.empty((0, 2), np.uint64))
        _write_descriptor(io, F.FORMAT_VERSION)
        names = set(env.listdir(path))
    where = io.p(F.STORE_FILE)
    version, code, dim = F.unpack_store(bytes(env.read(where)), where)
    if dim != io.dim or code != io.code:
        raise StoreFormatError(f"store {path!r} holds dim={dim} dtype={F.DTYPE_CODES[code]}, but "
                               f"dim={io.dim} dtype={io.dtype} was asked for")
    params = {kind_seq[1]: name for name in names if (kind_seq := F.parse_name(name)) and kind_seq[0] == "param"}
    junk = [n for n in names if (F.parse_name(n) or ("",))[0] == "tmp" or n in (F.MANIFEST_TMP, F.STORE_TMP)]
    if version == F.FORMAT_V1:
        listed = {s: env.size(io.p(n)) for s, n in params.items()}
        next_seq = max(listed, default=0) + 1
    else:
        if F.MANIFEST_FILE not in names:
            raise CorruptionError(f"{io.p(F.MANIFEST_FILE)} is missing: the store cannot tell which "
                                  "parameter files it should have; restore it from a backup or a checkpoint")
        next_seq, entries = F.unpack_manifest(env.read(io.p(F.MANIFEST_FILE)), io.p(F.MANIFEST_FILE))
        listed = dict(zip(entries[:, 0].tolist(), entries[:, 1].tolist()))
        missing = sorted(set(listed) - set(params))
        if missing:
            shown = ", ".join(io.p(F.param_name(s)) for s in missing[:3])
            raise CorruptionError(f"{len(missing)} parameter file(s) listed in the manifest are missing "
                                  f"({shown}{', ...' if len(missing) > 3 else ''}): their rows are lost; "
                                  "restore the store from a backup or a checkpoint")
        junk += [n for s, n in params.items() if s not in listed]
    for name in junk:
        env.remove(io.p(name))
    if junk:
        env.fsync_dir(path)
    cat = _rebuild(io, listed, next_seq, len(junk))
    if version == F.FORMAT_V1:      # upgrade: a manifest of the files found, then the new descriptor
        io.write_manifest(*cat.manifest())
        _write_descriptor(io, F.FORMAT_VERSION)
    return cat


def _write_descriptor(io, version: int) -> None:
    io.env.write_file(io.p(F.STORE_TMP), F.pack_store(io.code, io.dim, version))
    io.env.rename(io.p(F.STORE_TMP), io.p(F.STORE_FILE))
    io.env.fsync_dir(io.path)


def _rebuild(io, listed: dict, next_seq: int, discarded: int) -> Catalog:
    """Read the listed files ({seq: size}) -> the Catalog (index, file table, stale counters)."""
    seqs = sorted(listed)
    keys, vers, fseq, slots, files = [], [], [], [], {}
    tomb = []
    for seq in seqs:
        where = io.p(F.param_name(seq))
        size = io.env.size(where)
        if size != listed[seq]:
            raise CorruptionError(f"{where}: file is {size} bytes, the manifest says {listed[seq]}")
        hdr, k, v, crcs = io.read_meta(seq, size)
        keys.append(k)
        vers.append(v)
        fseq.append(np.full(hdr.n_rows, seq, dtype=np.int64))
        slots.append(np.arange(hdr.n_rows, dtype=np.int64))
        tomb.append(np.full(hdr.n_rows, hdr.layout.tombstones))
        files[seq] = FileMeta(seq, hdr.layout, crcs if hdr.version == F.FORMAT_VERSION else None,
                              horizon=int(v.min()) if hdr.n_rows else seq)
    total = sum(f.n_rows for f in files.values() if not f.tombstones)
    index = KeyIndex(width=2, capacity=INDEX_START_KEYS)
    if total:
        keys, vers = np.concatenate(keys), np.concatenate(vers)
        fseq, slots = np.concatenate(fseq), np.concatenate(slots)
        order = np.lexsort((slots, fseq, vers, keys))   # last key is the primary sort key
        ks = keys[order]
        win = order[np.flatnonzero(np.r_[ks[1:] != ks[:-1], True])]
        win = win[~np.concatenate(tomb)[win]]           # a key whose newest entry is a tombstone is gone
        loc = np.empty((win.shape[0], 2), dtype=np.int64)
        loc[:, 0] = fseq[win]
        loc[:, 1] = slots[win]
        index = KeyIndex(width=2, capacity=2 * win.shape[0] or INDEX_START_KEYS)
        index.assign(keys[win], loc)
        ordinal = np.searchsorted(np.asarray(seqs, dtype=np.int64), fseq[win])
        live = np.bincount(ordinal, minlength=len(seqs))
        for seq, lv in zip(seqs, live.tolist()):
            files[seq].stale = 0 if files[seq].tombstones else files[seq].n_rows - lv
    next_seq = max(next_seq, (seqs[-1] + 1) if seqs else 1)
    stats = dict(recovered_rows=len(index), recovered_files=len(files), discarded_files=discarded)
    if files or discarded:
        log.info("hps.ssd: opened %s: recovered %d live rows from %d files (%d stale rows); "
                 "discarded %d unacknowledged files", io.path, len(index), len(files), total - len(index),
                 discarded)
    return Catalog(index, files, next_seq, stats)
