"""The model export (``--export DIR``), written like a checkpoint, and reading a model back from an
export or a checkpoint.

Layout of an export directory::

    model.json                  the manifest (switched in last): what ``hps.Predictor`` needs
                                (``_manifest.EXPORT_META``), the batch the model is from, and the size
                                + CRC-32 of every file below; itself checksummed (``_manifest``)
    dense.h5                    one dataset per dense tensor, attr "model"
    sparse-rank{r}-of-{n}.h5    the keys rank r owns: "keys" (m,) uint64, "values" (m, embedding_dim)
                                float32 and, for models with first-order weights (wdl, deepfm),
                                "first_order" (m,) float32; attrs "embedding_dim" and "model"

**Writing** (:func:`export`): every rank writes its shard into ``DIR/.tmp-export/``, fsynced; rank 0
writes ``dense.h5`` and ``model.json`` there. Then rank 0 switches: it removes the old
``model.json`` (from here on the directory is an incomplete export, and says so), renames the data
files into ``DIR``, removes the shards of an earlier export by another number of ranks, renames
``model.json`` into place, fsyncs ``DIR`` and removes the empty ``.tmp-export``. A job killed at any
moment leaves ``DIR`` holding the earlier export, the new one, or an incomplete one that
:func:`read_model` refuses in one line; never a damaged file that reads as a model. Files of ``DIR``
that hps did not write are never touched; one of an export's names that no export wrote (a ``dense.h5``
or shard without the "model" attribute, in a ``DIR`` without ``model.json``) stops the job before it
trains (:func:`check_export_dir`). Running out of space is one ``DiskFullError``.

**Reading** (:func:`read_model`, :func:`load_export`): the directory may be an export, a checkpoint
(``ckpt-…`` with ``model.json``, written by this version on) or a ``--checkpoint-dir`` (its LATEST
checkpoint: the best one after ``--early-stop``). Every file is checked against its manifest before
HDF5 reads it: damage is one :class:`~hps.errors.CorruptionError` naming the file. Exports of older
layouts (``model.json`` without checksums, ``export_version`` 1, or no ``model.json``) are read
with a warning, unverified — they are users' trained models, and an HDF5 file that cannot be read
is still one CorruptionError naming it.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np

from ..errors import CorruptionError, InvalidInputError, StoreFormatError
from ._checkpoint import (_DENSE, _LATEST, _SHARD, BEST_DIR, fsync_path, _read_dense, _sparse_name, last_checkpoint,
                          undo_on_error)
from ._h5out import h5_output
from ._manifest import (EXPORT_META, EXPORT_VERSION, FILES_KEY, META_FILE, file_record, read_checked, read_meta,
                        verify_file, write_meta)

__all__ = ["export", "export_trained", "read_model", "load_export"]

#: Where an export is assembled before it is switched in (inside DIR). Written to disk: never rename.
TMP_DIR = ".tmp-export"
#: Export versions this code reads: 1 (no checksums) and EXPORT_VERSION (checksummed model.json).
READABLE_EXPORTS = (1, EXPORT_VERSION)
_STEP = 1 << 18  # rows converted at a time


def export(directory, coll, store, model, meta: dict | None = None, source=None) -> None:
    """Write ``model`` into ``directory`` (see the module docstring): its rows from ``store`` and its
    dense parameters from ``model``; or, with ``source`` (a checkpoint directory of this job's
    shape, verified first), the rows and dense parameters of that checkpoint (the best model of
    early stopping). ``meta`` (``hps.train._records.export_meta``) goes into model.json. Collective over
    ``coll``. Blocks. Raises DiskFullError when the device is full (after removing what it wrote;
    an earlier export in ``directory`` is left as it was)."""
    d = Path(directory)
    tmp = d / TMP_DIR

    def undo(*paths):
        return undo_on_error(paths, f"the export {d}", lambda: "the earlier export, if any, is intact")

    problem = None
    if coll.rank == 0:
        try:
            check_export_dir(d)
        except InvalidInputError as e:
            problem = str(e)
    problem = coll.allgather(problem)[0]   # every rank stops before writing
    if problem:
        raise InvalidInputError(problem)
    if coll.rank == 0:
        with undo(tmp):
            d.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # left by an export that was killed
            tmp.mkdir()
    coll.barrier()
    name = _sparse_name(coll.rank, coll.size)
    with undo(tmp):
        if source is None:
            rows = tmp / f".rows-rank{coll.rank}.h5"
            with h5_output(rows, durable=False) as h:
                store.export_h5(h)
        else:
            rows = Path(source) / name
            _verify_checkpoint_file(Path(source), name)
        _write_shard(rows, tmp / name, model)
        if source is None:
            rows.unlink()
        mine = file_record(tmp / name)
    records = coll.gather(np.array([[mine["bytes"], mine["crc32"]]], dtype=np.int64))
    if coll.rank == 0:
        with undo(tmp):
            dense = model.state_dict() if source is None else _checkpoint_dense(Path(source))
            with h5_output(tmp / _DENSE) as h:
                for k, v in dense.items():
                    h.create_dataset(k, data=v)
                h.attrs["model"] = model.name
            files = {_sparse_name(r, coll.size): {"bytes": int(b), "crc32": int(c)} for r, (b, c) in enumerate(records)}
            files[_DENSE] = file_record(tmp / _DENSE)
            write_meta(tmp / EXPORT_META, dict(meta or {}, export_version=EXPORT_VERSION, **{FILES_KEY: files}))
            fsync_path(tmp, directory=True)
        _switch(d, tmp, files)
    coll.barrier()


def export_trained(directory, coll, store, model, meta: dict, choice: tuple, checkpoint_dir, log) -> dict:
    """Export what ``choice`` (``hps.train._control.TrainingControl.export_choice``: the checkpoint to export or
    None for the model as it is, and its record) says — after ``--early-stop`` the best checkpoint,
    else the model as it is — with ``meta`` and the record in model.json; remove ``checkpoint_dir``
    (where the checkpoints went) when it was kept only for the export; say what was exported
    (``log``) -> the record (batch, source, eval_auc, best). Collective over ``coll``."""
    source, about = choice
    export(directory, coll, store, model, meta=dict(meta, **about), source=source)
    if coll.rank == 0 and checkpoint_dir == os.path.join(directory, BEST_DIR):
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    auc = f", eval AUC {about['eval_auc']:.4f}" if about["eval_auc"] is not None else ""
    log(f"hps: exported {about['source']}, after batch {about['batch']}{auc}, to {directory}")
    return about


def _write_shard(rows_h5: Path, out: Path, model) -> None:
    """Convert a file of whole rows ("keys", "rows" (m, row_width): the SSD-PS's export or a
    checkpoint shard) into an export shard of ``model`` (its parameter columns), fsynced."""
    import h5py

    D = model.emb_dim
    with h5py.File(rows_h5, "r") as src, h5_output(out) as dst:
        n = src["keys"].shape[0]
        dst.create_dataset("keys", data=src["keys"][()])
        values = dst.create_dataset("values", shape=(n, D), dtype=np.float32)
        first = dst.create_dataset("first_order", shape=(n,), dtype=np.float32) if model.first_order else None
        for a in range(0, n, _STEP):
            rows = src["rows"][a:a + _STEP]
            values[a:a + _STEP] = rows[:, :D]
            if first is not None:
                first[a:a + _STEP] = rows[:, D]
        dst.attrs["embedding_dim"] = D
        dst.attrs["model"] = model.name


def check_export_dir(directory) -> None:
    """Raise InvalidInputError when ``directory`` holds files an export would replace or remove that no
    hps export wrote (:func:`_foreign_files`), naming them: nothing of the user's is overwritten."""
    d = Path(directory)
    foreign = _foreign_files(d)
    if foreign:
        raise InvalidInputError(f"--export {d} holds {', '.join(foreign)} that no hps export wrote (no "
                                f"{EXPORT_META}, no model attribute); the export would replace them: move "
                                "them, or export into another directory")


def _foreign_files(d: Path) -> list[str]:
    """The files of ``d`` an export would replace or remove (``dense.h5``, shards) that no hps export
    wrote, when ``d`` has no model.json: an export interrupted mid-switch leaves hps's own there (each
    with its "model" attribute); a file without it is someone else's. Empty when ``d`` is new or an export."""
    if not d.is_dir() or (d / EXPORT_META).exists():
        return []
    import h5py

    out = []
    for p in sorted(d.iterdir()):
        if p.is_file() and (p.name == _DENSE or _SHARD.fullmatch(p.name)):
            try:
                with h5py.File(p, "r") as h:
                    ours = "model" in h.attrs or "embedding_dim" in h.attrs
            except OSError:
                ours = False
            if not ours:
                out.append(p.name)
    return out


def _switch(d: Path, tmp: Path, files: dict) -> None:
    """Rank 0: move the export assembled in ``tmp`` into ``d``, model.json last (module docstring)."""
    (d / EXPORT_META).unlink(missing_ok=True)
    fsync_path(d, directory=True)
    for name in files:
        os.replace(tmp / name, d / name)
    for p in d.iterdir():  # shards of an earlier export by another number of ranks
        if _SHARD.fullmatch(p.name) and p.name not in files and p.is_file():
            p.unlink()
    os.replace(tmp / EXPORT_META, d / EXPORT_META)
    fsync_path(d, directory=True)
    os.rmdir(tmp)
    fsync_path(d, directory=True)


def _verify_checkpoint_file(ckpt: Path, name: str) -> dict:
    """meta.json of checkpoint ``ckpt``, with ``name`` verified against it -> meta."""
    meta = read_meta(ckpt / META_FILE)
    files = meta.get(FILES_KEY)
    if files is None:
        raise InvalidInputError(f"{ckpt} is a version-1 checkpoint, without the model's description: resume "
                                "from it with --resume and export the model with --export")
    if name not in files:
        raise CorruptionError(f"{ckpt / META_FILE} is damaged: it has no checksum of {name}")
    verify_file(ckpt / name, files[name])
    return meta


def _checkpoint_dense(ckpt: Path) -> dict:
    _verify_checkpoint_file(ckpt, _DENSE)
    return _read_dense(ckpt / _DENSE)[0]


# -- reading ------------------------------------------------------------------------------------------------

def read_model(directory, warn=None) -> tuple[dict, tuple]:
    """The model in ``directory`` (an export, a checkpoint or a --checkpoint-dir: see the module
    docstring) -> ``(meta, (keys (m,) uint64, values (m, dim) float32, dense {name: array},
    first_order (m,) float32 or None))``, every shard merged; ``meta`` is model.json (empty for
    an export without one) with ``path``, the directory read. ``warn(message)`` hears that an
    older export is read unverified (default: ``warnings.warn``). Raises CorruptionError (a
    damaged or incomplete model, naming the file), InvalidInputError (not a model),
    StoreFormatError (a layout this version cannot read)."""
    warn = warn or (lambda msg: warnings.warn(msg, stacklevel=3))
    d = Path(directory)
    if not d.is_dir():
        raise InvalidInputError(f"{d} is not a directory: give an export (--export DIR) or a checkpoint")
    if (d / _LATEST).exists() or (not (d / META_FILE).exists() and last_checkpoint(d) is not None):
        ckpt = last_checkpoint(d)
        if ckpt is None:
            raise CorruptionError(f"{d} is a checkpoint directory without an intact checkpoint")
        d = ckpt
    if (d / META_FILE).exists():
        return _read_checkpoint(d)
    return _read_export(d, warn)


def _read_export(d: Path, warn) -> tuple[dict, tuple]:
    if not (d / EXPORT_META).exists():
        if (d / TMP_DIR).exists():
            raise CorruptionError(f"{d} is an incomplete export (no {EXPORT_META}; a job writing it was stopped): "
                                  "export the model again")
        shards = _shards(d)
        warn(f"{d} is an export of an older hps, without {EXPORT_META} or checksums: read unverified")
        return {"path": str(d)}, _read_arrays(d, shards, _DENSE, dense_group=None)
    meta, checked = read_checked(d / EXPORT_META, "export")
    version = meta.get("export_version")
    if version not in READABLE_EXPORTS:
        raise StoreFormatError(f"{d / EXPORT_META}: export version {version}; this hps reads versions "
                               f"{', '.join(map(str, READABLE_EXPORTS))}")
    files = meta.get(FILES_KEY)
    if version == 1:
        warn(f"{d} is an export of an older hps (export version 1, without checksums): read unverified; "
             "export it again to have it verified")
        shards = _shards(d)
    elif not checked or files is None:
        raise CorruptionError(f"{d / EXPORT_META} is damaged: it has no checksums")
    else:
        shards = sorted((n for n in files if _SHARD.fullmatch(n)), key=lambda n: int(_SHARD.fullmatch(n).group(1)))
        for name in files:
            verify_file(d / name, files[name], "export", EXPORT_META)
    return dict(meta, path=str(d)), _read_arrays(d, shards, _DENSE, dense_group=None)


def _read_checkpoint(d: Path) -> tuple[dict, tuple]:
    meta = read_meta(d / META_FILE)
    files = meta.get(FILES_KEY)
    if files is None or EXPORT_META not in files:
        raise InvalidInputError(f"{d} is a checkpoint of an older hps, without the model's description "
                                f"({EXPORT_META}): resume from it with --resume and export the model with --export")
    for name in files:
        verify_file(d / name, files[name])
    model, _ = read_checked(d / EXPORT_META)
    shards = [_sparse_name(r, meta["ranks"]) for r in range(meta["ranks"])]
    out = _read_arrays(d, shards, _DENSE, dense_group="params", emb_dim=int(model["model_config"]["emb_dim"]),
                       first_order=int(model["row_params"]) > int(model["model_config"]["emb_dim"]))
    return dict(model, path=str(d), batch=meta["index"]), out


def _shards(d: Path) -> list[str]:
    """The shard names of an export without checksums, checked to be one complete set."""
    found = sorted(p.name for p in d.glob("sparse-rank*-of-*.h5"))
    if not found:
        raise InvalidInputError(f"{d} has no {EXPORT_META} and no sparse-rank*-of-*.h5 files: not an hps "
                                "export or checkpoint")
    n = int(_SHARD.fullmatch(found[0]).group(2))
    expected = [_sparse_name(r, n) for r in range(n)]
    if sorted(found) != sorted(expected):
        raise StoreFormatError(f"{d}: export shards {found} do not match the {n} expected ({expected})")
    return expected


def _read_arrays(d: Path, shards: list, dense_file: str, dense_group, emb_dim=None, first_order=False) -> tuple:
    """Merge the shards -> (keys, values, dense, first_order or None). Export shards hold "values"
    (and "first_order"); checkpoint shards whole "rows", cut at ``emb_dim``. An HDF5 file that
    cannot be read is a CorruptionError naming it."""
    import h5py

    keys, values, first = [], [], []
    for name in shards:
        with _readable(d / name) as h:
            keys.append(h["keys"][()])
            if emb_dim is None:
                values.append(h["values"][()])
                if "first_order" in h:
                    first.append(h["first_order"][()])
            else:
                rows = h["rows"][()]
                values.append(np.ascontiguousarray(rows[:, :emb_dim], dtype=np.float32))
                if first_order:
                    first.append(np.ascontiguousarray(rows[:, emb_dim], dtype=np.float32))
    with _readable(d / dense_file) as h:
        g = h[dense_group] if dense_group else h
        dense = {k: g[k][()] for k in g if isinstance(g[k], h5py.Dataset)}
    if first and len(first) != len(shards):
        raise StoreFormatError(f"{d}: only {len(first)} of {len(shards)} shards hold first-order weights")
    return np.concatenate(keys), np.concatenate(values), dense, np.concatenate(first) if first else None


class _readable:
    """``with _readable(path) as h``: the HDF5 file open for reading; any failure to read it
    (h5py's OSError, KeyError of a missing dataset) is one CorruptionError naming the file."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        import h5py

        try:
            self.h = h5py.File(self.path, "r")
        except FileNotFoundError:
            raise CorruptionError(f"{self.path} is missing: the export is incomplete") from None
        except OSError as e:
            raise CorruptionError(f"{self.path} cannot be read as HDF5 (the file is damaged): "
                                  f"{str(e).splitlines()[0]}") from None
        return self.h

    def __exit__(self, kind, e, tb):
        self.h.close()
        if isinstance(e, (OSError, KeyError, ValueError)) and not isinstance(e, CorruptionError):
            raise CorruptionError(f"{self.path} cannot be read (the file is damaged): "
                                  f"{(str(e).splitlines() or [type(e).__name__])[0]}") from None
        return False


def load_export(directory, first_order: bool = False):
    """Read a model back (an export, a checkpoint or a --checkpoint-dir; see :func:`read_model`):
    ``(keys (m,) uint64, values (m, dim) float32, dense {name: array})``, every shard merged. With
    ``first_order=True`` a fourth item follows: the first-order weight of each key (m,) float32
    (wdl, deepfm), or None for models without one. Raises CorruptionError naming a damaged file."""
    _, (keys, values, dense, first) = read_model(directory)
    return (keys, values, dense, first) if first_order else (keys, values, dense)
