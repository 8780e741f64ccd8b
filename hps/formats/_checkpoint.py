"""Checkpoints: consistent cuts at a batch boundary.

Checkpoint layout under ``--checkpoint-dir`` (a directory every rank can reach)::

    LATEST                          name of the newest complete checkpoint (switched atomically)
    LOCK                            flock'ed by the job writing here; "pid P on HOST" of that job
    ckpt-00000041/                  state after global batch 41
        meta.json                   batch position, ranks, row width, model name, CHECKPOINT_VERSION,
                                    and the size + CRC-32 of every file below; itself checksummed
                                    (_manifest)
        dense.h5                    params/<name> and optimizer/<slot>/<name>, attrs step and hypers
        sparse-rank{r}-of-{n}.h5    every row rank r owns: "keys" (m,) uint64, "rows" (m, row_width)
        model.json                  the model and its input, as in an export (``hps.train._records``), so that
                                    ``hps.predict`` can score a checkpoint (``_export.read_model``);
                                    absent in checkpoints of older versions

One job writes into a checkpoint directory at a time: it holds ``LOCK`` (an flock, :func:`locked`) from
start to end, so a second job there stops at once (its pruning would remove the first's unfinished
checkpoint, its ``--resume`` load the first's model). A checkpoint is written into ``.tmp-ckpt-…``,
fsynced, renamed into place, and only then named in ``LATEST`` (write temp, fsync, rename — the LevelDB
manifest switch), so a crash at any moment leaves the previous checkpoint usable. Then all but the
``keep`` newest checkpoints are removed (a ``ckpt-…`` holding other files than a checkpoint's is someone
else's and stays). A save that fails (e.g. ENOSPC: :class:`~hps.errors.DiskFullError`) removes what it
wrote; the previous checkpoint stays as it was. HDF5 files are written through ``_h5out`` (a full disk is one error).

``load`` checks every file it reads against meta.json before using it. When the newest checkpoint is
damaged (:class:`~hps.errors.CorruptionError`) it falls back to the next older complete one, if one
is kept, and says so; under MPI the ranks agree on the checkpoint (each checks its own shard).

The model export (``--export DIR``) is written the same way by ``_export``.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX: no lock
    fcntl = None

from ..errors import CorruptionError, DiskFullError, HpsError, InvalidInputError, StoreLockedError
from ._h5out import h5_output
from ._manifest import (CHECKPOINT_VERSION, EXPORT_META, FILES_KEY, META_FILE, file_record, read_meta, verify_file,
                        write_meta)

__all__ = ["CHECKPOINT_VERSION", "save", "load", "latest", "last_checkpoint"]

#: Where the best checkpoints of ``--early-stop`` go when there is no ``--checkpoint-dir`` (inside
#: the ``--export`` directory, which every rank reaches). Written to disk: never rename.
BEST_DIR = ".best-checkpoint"
_LATEST = "LATEST"
#: The lock file of a checkpoint directory (:func:`locked`). Written to disk: never rename.
LOCK_FILE = "LOCK"
_DENSE = "dense.h5"
_NAME = re.compile(r"ckpt-(\d+)")
_SPACE_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def fsync_path(path: Path, directory: bool = False) -> None:
    """fsync the file (or, with ``directory``, the directory) at ``path``: what a rename made durable."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def locked(root, coll):
    """Hold checkpoint directory ``root`` (created when missing; None: nothing to hold) for this job while
    the block runs: rank 0 takes an exclusive flock on ``root/LOCK`` and writes who holds it there.
    Collective over ``coll``: every rank raises StoreLockedError, naming the holder, when another job
    holds it. The lock goes with the process (a killed job holds nothing); the file stays."""
    fd, problem = None, None
    if root and coll.rank == 0 and fcntl is not None:
        try:
            fd = _take_lock(Path(root))
        except StoreLockedError as e:
            problem = (True, str(e))
        except OSError as e:  # every rank stops, not rank 0 alone
            problem = (False, f"cannot write --checkpoint-dir {root} ({e}); give a directory this job can write")
    if root:
        problems = coll.allgather(problem)
        if problems[0] is not None:
            held, message = problems[0]
            raise (StoreLockedError if held else InvalidInputError)(message)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing the file releases its flock


def _take_lock(root: Path) -> int:
    """The flock'ed ``root/LOCK`` (an fd, "pid P on HOST" written in it). Raises StoreLockedError."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "its pid unknown"
        os.close(fd)
        raise StoreLockedError(f"--checkpoint-dir {root} is in use by another job ({holder}); give each job "
                               "its own --checkpoint-dir, or wait for that job to end") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


def checkpoint_name(index: int) -> str:
    """The directory name of the checkpoint after global batch ``index``."""
    return f"ckpt-{index:08d}"


#: The name of a rank's sparse file (:func:`_sparse_name`), in a checkpoint and an export; groups rank, ranks.
_SHARD = re.compile(r"sparse-rank(\d+)-of-(\d+)\.h5")


def _sparse_name(rank: int, size: int) -> str:
    return f"sparse-rank{rank}-of-{size}.h5"


def _write_dense(path: Path, model, dense_opt) -> None:
    with h5_output(path) as h:  # fsynced; a full disk is one OSError
        for k, v in model.state_dict().items():
            h.create_dataset(f"params/{k}", data=v)
        if dense_opt is not None:
            st = dense_opt.state_dict()
            g = h.create_group("optimizer")
            for k, v in st.items():
                if isinstance(v, dict):
                    for name, arr in v.items():
                        g.create_dataset(f"{k}/{name}", data=arr)
                else:
                    g.attrs[k] = v


def _read_dense(path: Path):
    import h5py

    with h5py.File(path, "r") as h:
        params = {k: h[f"params/{k}"][()] for k in h["params"]}
        opt = None
        if "optimizer" in h:
            g = h["optimizer"]
            opt = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in g.attrs.items()}
            opt = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in opt.items()}
            for slot in g:
                opt[slot] = {name: g[slot][name][()] for name in g[slot]}
    return params, opt


def _is_space_error(e: BaseException) -> bool:
    """ENOSPC/EDQUOT, also as h5py reports it (an OSError whose errno it may or may not set)."""
    return isinstance(e, OSError) and (e.errno in _SPACE_ERRNOS or os.strerror(errno.ENOSPC) in str(e))


@contextmanager
def undo_on_error(paths, what: str, kept):
    """On any error: remove ``paths`` (files or directories written by the call), and turn running
    out of space into a one-line DiskFullError: "while writing ``what``; removed its partial files
    and ``kept()``" (what is still intact)."""
    try:
        yield
    except BaseException as e:
        for p in paths:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        if _is_space_error(e):
            raise DiskFullError(errno.ENOSPC, f"no space left on the device while writing {what}; removed its "
                                              f"partial files and {kept()}") from e
        raise


def _undo_on_error(root: Path, name: str, *paths: Path):
    """:func:`undo_on_error` for checkpoint ``name``: the previous checkpoint is intact."""
    def kept():
        prev = _read_latest(root)
        return f"the previous checkpoint {root / prev} is intact" if prev else "no earlier checkpoint exists"

    return undo_on_error(paths, f"checkpoint {name} in {root}", kept)


def save(root, coll, store, model, dense_opt, meta: dict, keep: int = 1, extra=None, pinned=(),
         model_meta: dict | None = None) -> str:
    """Write this rank's part of the checkpoint named by ``meta["index"]``, then keep only the ``keep``
    newest checkpoints (and the checkpoints named in ``pinned``). ``extra(h5file)``, if given, adds
    this rank's other state to its sparse file (e.g. admission state; read back by :func:`load`'s
    ``extra``). ``model_meta`` (``hps.train._records.export_meta``), if given, is written as ``model.json``,
    so the checkpoint can be scored like an export (``_export.read_model``). Collective over
    ``coll``. Blocks. Raises DiskFullError when the device is full (after removing what this save
    wrote; the previous checkpoint is untouched)."""
    root = Path(root)
    name = checkpoint_name(meta["index"])
    tmp = root / f".tmp-{name}"
    sparse = _sparse_name(coll.rank, coll.size)
    with _undo_on_error(root, name, tmp):
        tmp.mkdir(parents=True, exist_ok=True)
        with h5_output(tmp / sparse) as h:  # fsynced; a full disk is one OSError
            store.export_h5(h)
            if extra is not None:
                extra(h)
        mine = file_record(tmp / sparse)
    records = coll.gather(np.array([[mine["bytes"], mine["crc32"]]], dtype=np.int64))
    if coll.rank == 0:
        with _undo_on_error(root, name, tmp):
            _write_dense(tmp / _DENSE, model, dense_opt)
            files = {_sparse_name(r, coll.size): {"bytes": int(b), "crc32": int(c)}
                     for r, (b, c) in enumerate(records)}
            files[_DENSE] = file_record(tmp / _DENSE)
            if model_meta is not None:
                write_meta(tmp / EXPORT_META, model_meta)
                files[EXPORT_META] = file_record(tmp / EXPORT_META)
            write_meta(tmp / META_FILE, dict(meta, ranks=coll.size, row_width=store.dim, model=model.name,
                                             version=CHECKPOINT_VERSION, **{FILES_KEY: files}))
    coll.barrier()
    if coll.rank == 0:
        _commit(root, tmp, name)
        _prune(root, name, keep, pinned)
    coll.barrier()
    return str(root / name)


def _commit(root: Path, tmp: Path, name: str) -> None:
    """Rename ``tmp`` to ``name`` and switch LATEST to it (write temp, fsync, rename)."""
    final, latest_tmp = root / name, root / f".{_LATEST}.tmp"
    with _undo_on_error(root, name, tmp):
        fsync_path(tmp, directory=True)
        if final.exists():
            if not _is_checkpoint(final):
                raise InvalidInputError(f"{final} is in the way of this job's checkpoint and holds files that "
                                        "are no checkpoint's; move it, or give another --checkpoint-dir")
            shutil.rmtree(final)  # the same batch, written by an earlier run into this directory
        os.rename(tmp, final)
    with _undo_on_error(root, name, final, latest_tmp):
        point_latest(root, name)


def point_latest(root, name: str) -> None:
    """Switch ``root/LATEST`` to the existing checkpoint ``name`` (write temp, fsync, rename, fsync
    the directory); early stopping points it back at the best checkpoint."""
    root = Path(root)
    latest_tmp = root / f".{_LATEST}.tmp"
    latest_tmp.write_text(name + "\n")
    fsync_path(latest_tmp)
    os.rename(latest_tmp, root / _LATEST)
    fsync_path(root, directory=True)


def _prune(root: Path, name: str, keep: int, pinned=()) -> None:
    """Keep ``name``, the ``keep - 1`` newest checkpoints before it and those named in ``pinned``;
    remove every other ``ckpt-*`` checkpoint (later ones are from an earlier run into this directory;
    a directory of that name holding other files than a checkpoint's is not hps's and stays)
    and every ``.tmp-ckpt-*`` (a save that was killed before it could remove its own: only a complete
    save reaches here)."""
    current = _index(name)
    older = _newest_first(root, below=current)[:keep - 1]
    for d in _newest_first(root):
        if d.name != name and d not in older and d.name not in pinned and _is_checkpoint(d):
            shutil.rmtree(d, ignore_errors=True)
    for d in root.iterdir():
        if d.name.startswith(".tmp-") and _NAME.fullmatch(d.name[len(".tmp-"):]) and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


_FILE_NAME = re.compile(rf"{re.escape(META_FILE)}|{re.escape(_DENSE)}|{re.escape(EXPORT_META)}|{_SHARD.pattern}")


def _is_checkpoint(d: Path) -> bool:
    """Whether directory ``d`` holds a checkpoint's files and nothing else (intact or damaged: hps wrote
    it); a directory holding any other name is someone else's."""
    try:
        names = [p.name for p in d.iterdir()]
    except OSError:
        return False
    return bool(names) and all(_FILE_NAME.fullmatch(n) for n in names)


def _index(name: str) -> int:
    return int(_NAME.fullmatch(name).group(1))


def _newest_first(root: Path, below: int | None = None) -> list[Path]:
    """The ``ckpt-*`` directories under ``root`` (those before batch ``below``), newest first."""
    found = [p for p in (root.iterdir() if root.is_dir() else ()) if _NAME.fullmatch(p.name) and p.is_dir()]
    return sorted((p for p in found if below is None or _index(p.name) < below),
                  key=lambda p: _index(p.name), reverse=True)


def _read_latest(root: Path) -> str | None:
    """The checkpoint name in LATEST if it names an existing checkpoint directory, else None."""
    try:
        name = (root / _LATEST).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if _NAME.fullmatch(name) and (root / name).is_dir() else None


def latest(root) -> Path:
    """The checkpoint directory named in ``root/LATEST``; InvalidInputError when there is none,
    CorruptionError when LATEST is damaged."""
    root = Path(root)
    if not (root / _LATEST).exists():
        raise InvalidInputError(f"no checkpoint in {root} (no {_LATEST} file); run once with "
                                "--checkpoint-dir before --resume")
    name = _read_latest(root)
    if name is None:
        raise CorruptionError(f"{root / _LATEST} is damaged: it does not name a checkpoint directory")
    return root / name


def last_checkpoint(root) -> Path | None:
    """The checkpoint ``--resume`` would start from — the newest of LATEST's and the older ones kept
    whose meta.json is intact (the data files are verified by :func:`load` only) — or None."""
    try:
        candidates = _candidates(Path(root), [])
    except HpsError:
        return None
    for d in candidates:
        try:
            read_meta(d / META_FILE)
            return d
        except (HpsError, OSError):
            continue
    return None


def _candidates(root: Path, notes: list) -> list[Path]:
    """Checkpoints to try, newest first: LATEST's, then the older ones kept (all of them, newest
    first, when LATEST is missing or damaged; a note says so)."""
    try:
        first = latest(root)
    except (CorruptionError, InvalidInputError) as e:
        if not _newest_first(root):
            raise
        notes.append(str(e) if isinstance(e, CorruptionError) else f"{root / _LATEST} is missing")
        return _newest_first(root)
    return [first] + _newest_first(root, below=_index(first.name))


def _check(d: Path, rank: int, size: int, dim: int, model_name: str | None = None) -> dict:
    """meta.json of checkpoint ``d`` and the files this rank reads, verified -> meta. Raises
    CorruptionError (damage) or InvalidInputError (a checkpoint of another job shape, or of another
    model than ``model_name`` when given)."""
    meta = read_meta(d / META_FILE)
    if _index(d.name) != meta["index"]:
        raise CorruptionError(f"{d / META_FILE} records batch {meta['index']}, not the batch of {d.name}")
    if meta["ranks"] != size:
        raise InvalidInputError(f"checkpoint {d} was written by {meta['ranks']} ranks; resume with the same "
                                f"number of ranks (got {size})")
    if model_name is not None and meta.get("model", "ctr") != model_name:  # older ones: all ctr
        raise InvalidInputError(f"checkpoint {d} holds a --model {meta.get('model', 'ctr')} model; resume "
                                f"with the same --model (got {model_name})")
    if meta["row_width"] != dim:
        raise InvalidInputError(f"checkpoint rows have {meta['row_width']} columns, this run {dim}: "
                                "resume with the same --embedding-dim and optimizer")
    files = meta.get(FILES_KEY)
    if files is not None:
        for f in (_DENSE, _sparse_name(rank, size)):
            if f not in files:
                raise CorruptionError(f"{d / META_FILE} is damaged: it has no checksum of {f}")
            verify_file(d / f, files[f])
    return meta


def _choose(root: Path, coll, dim: int, model_name: str, warn) -> tuple[Path, dict]:
    """The newest checkpoint every rank verified -> (directory, meta). Collective over ``coll``."""
    notes = []
    for d in _candidates(root, notes):
        problem, meta = None, None
        try:
            meta = _check(d, coll.rank, coll.size, dim, model_name)
        except CorruptionError as e:
            problem = str(e)
        bad = coll.allgather(problem is not None)
        if not any(bad):
            if notes:
                warn(f"{'; '.join(notes)}: resuming from {d} instead")
            if meta.get(FILES_KEY) is None:
                warn(f"{d} is a version-1 checkpoint, written without checksums: resuming unverified")
            return d, meta
        first = bad.index(True)
        notes.append(problem if bad[coll.rank] else
                     f"{d / _sparse_name(first, coll.size)} failed its check on rank {first}")
    raise CorruptionError(f"{'; '.join(notes)}; no older intact checkpoint is kept in {root} "
                          "(--keep-checkpoints K keeps the K newest)")


def load(root, coll, store, model, dense_opt, warn=lambda msg: None, extra=None, accept=None) -> dict:
    """Restore this rank's rows into ``store`` (an empty store) and the dense state from the newest
    intact checkpoint -> its meta, with ``path``. ``warn(message)`` hears of every damaged checkpoint
    skipped; ``accept(meta, path)``, if given, is called before anything is restored and may raise
    (e.g. the checkpoint is of other data; it must answer alike on every rank); ``extra(h5file)``
    reads what :func:`save`'s ``extra`` wrote. Collective over ``coll``. Raises CorruptionError when
    no intact checkpoint is left."""
    d, meta = _choose(Path(root), coll, store.dim, model.name, warn)
    if accept is not None:
        accept(meta, str(d))
    store.import_h5(str(d / _sparse_name(coll.rank, coll.size)))
    if extra is not None:
        import h5py

        with h5py.File(d / _sparse_name(coll.rank, coll.size), "r") as h:
            extra(h)
    params, opt = _read_dense(d / _DENSE)
    try:
        model.load_state_dict(params)
    except InvalidInputError as e:  # e.g. another --hidden: name the checkpoint and what to do
        raise InvalidInputError(f"checkpoint {d} holds a {model.name} model of other shapes ({e}); resume "
                                "with the model options it was written with (--hidden and the model's "
                                "own, e.g. --cross-layers)") from None
    if opt is not None and dense_opt is not None:  # this job's hyperparameters: another --dense-lr is used, as --lr
        dense_opt.load_state_dict(opt, hyperparameters=False)
    return dict(meta, path=str(d))
