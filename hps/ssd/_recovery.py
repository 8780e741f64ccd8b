"""Creating and opening a store: the descriptor check and the index rebuild (crash recovery).

Open = create the directory -> take the ``LOCK`` -> check ``STORE`` (dim, dtype, version), or write it
when the store is new -> delete temp files (writes that were never renamed into place, hence never
acknowledged) -> read every parameter file's header and keys section (checksummed; a damaged
acknowledged file raises CorruptionError) in sequence order -> for each key keep the row with the
highest (version, file seq, slot) -> per-file stale counters.
"""

from __future__ import annotations

import logging

import numpy as np

from ..errors import CorruptionError, StoreError, StoreFormatError, StoreLockedError
from . import _format as F
from ._store import _File

log = logging.getLogger("hps.ssd")

_STORE_TMP = F.STORE_FILE + ".tmp"


def open_store(store) -> None:
    """Create or open the store directory. The ``LOCK`` is taken before the descriptor is written or
    trusted, so two processes creating one store cannot interleave: the loser gets StoreLockedError
    (or StoreFormatError when the winner's store has another dim/dtype), never half a descriptor."""
    env, path = store._env, store.path
    if env.exists(path) and not env.isdir(path):
        raise StoreFormatError(f"{path!r} is not an hps SSD store (it is not a directory)")
    env.mkdir(path)
    _check_descriptor(store, set(env.listdir(path)))  # refuse a foreign directory before adding LOCK to it
    try:
        store._lock_handle = env.lock(store._p(F.LOCK_FILE))
    except BlockingIOError as e:
        raise StoreLockedError(f"store {path!r} is open in another process ({e.strerror}); close it "
                               "there or use another path") from e
    except OSError as e:
        raise StoreError(f"cannot lock store {path!r}: {e.strerror or e}") from e
    try:
        names = set(env.listdir(path))  # again, under the lock: a racing creator may have finished
        if not _check_descriptor(store, names):
            env.write_file(store._p(_STORE_TMP), F.pack_store(store._code, store.dim))
            env.rename(store._p(_STORE_TMP), store._p(F.STORE_FILE))
            env.fsync_dir(path)
            names = set(env.listdir(path))
        _recover(store, names)
    except BaseException:
        env.unlock(store._lock_handle)
        store._lock_handle = None
        raise


def _check_descriptor(store, names) -> bool:
    """-> whether ``STORE`` exists (and matches dim/dtype); raises StoreFormatError when the directory
    holds a store of another dim/dtype, or files that are not a store's."""
    if F.STORE_FILE in names:
        where = store._p(F.STORE_FILE)
        code, dim = F.unpack_store(bytes(store._env.read(where)), where)
        if dim != store.dim or code != store._code:
            raise StoreFormatError(
                f"store {store.path!r} holds dim={dim} dtype={F.DTYPE_CODES[code]}, but dim={store.dim} "
                f"dtype={store.dtype} was asked for")
        return True
    if names - {F.LOCK_FILE, _STORE_TMP}:
        raise StoreFormatError(f"{store.path!r} is not an hps SSD store (no {F.STORE_FILE} file, and "
                               "the directory is not empty)")
    return False


def _recover(store, names) -> None:
    env = store._env
    params, discarded = [], 0
    for name in names:
        kind_seq = F.parse_name(name)
        if kind_seq is None:
            continue
        kind, seq = kind_seq
        if kind == "tmp":
            env.remove(store._p(name))
            discarded += 1
        else:
            params.append(seq)
    if discarded:
        env.fsync_dir(store.path)
    params.sort()
    keys, vers, fseq, slots, files = [], [], [], [], []
    for seq in params:
        where = store._p(F.param_name(seq))
        size = env.size(where)
        hdr = F.Header(env.read(where, 0, F.HEADER_SIZE), where, size)
        if hdr.seq != seq:
            raise CorruptionError(f"{where}: header sequence number {hdr.seq} does not match the name")
        if hdr.dim != store.dim or hdr.code != store._code:
            raise CorruptionError(f"{where}: dim/dtype code {hdr.dim}/{hdr.code} differ from the store's")
        k, v = F.parse_keys(env.read(where, 0, hdr.rows_offset), hdr, where)
        keys.append(k)
        vers.append(v)
        fseq.append(np.full(hdr.n_rows, seq, dtype=np.int64))
        slots.append(np.arange(hdr.n_rows, dtype=np.int64))
        files.append(_File(seq, hdr.n_rows, size))
    total = sum(f.n_rows for f in files)
    if total:
        keys, vers = np.concatenate(keys), np.concatenate(vers)
        fseq, slots = np.concatenate(fseq), np.concatenate(slots)
        order = np.lexsort((slots, fseq, vers, keys))   # last key is the primary sort key
        ks = keys[order]
        win = order[np.flatnonzero(np.r_[ks[1:] != ks[:-1], True])]
        loc = np.empty((win.shape[0], 2), dtype=np.int64)
        loc[:, 0] = fseq[win]
        loc[:, 1] = slots[win]
        store._index = type(store._index)(width=2, capacity=2 * win.shape[0])
        store._index.assign(keys[win], loc)
        ordinal = np.searchsorted(np.asarray(params, dtype=np.int64), fseq[win])
        live = np.bincount(ordinal, minlength=len(files))
        for f, lv in zip(files, live.tolist()):
            f.stale = f.n_rows - lv
    for f in files:
        store._files[f.seq] = f
    store._total_rows = total
    store._next_seq = (params[-1] + 1) if params else 1
    st = store._stats
    st["recovered_rows"] = len(store._index)
    st["recovered_files"] = len(files)
    st["discarded_files"] = discarded
    if files or discarded:
        log.info("hps.ssd: opened %s: recovered %d live rows from %d files (%d stale rows); "
                 "discarded %d unacknowledged temp files", store.path, len(store._index), len(files),
                 total - len(store._index), discarded)
