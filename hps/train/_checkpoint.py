"""Checkpoints (consistent cuts at a batch boundary) and the HDF5 model export.

Checkpoint layout under ``--checkpoint-dir`` (a directory every rank can reach)::

    LATEST                          name of the newest complete checkpoint (switched atomically)
    ckpt-00000041/                  state after global batch 41
        meta.json                   batch position, ranks, row width, CHECKPOINT_VERSION
        dense.h5                    params/<name> and optimizer/<slot>/<name>, attrs step and hypers
        sparse-rank{r}-of-{n}.h5    every row rank r owns: "keys" (m,) uint64, "rows" (m, row_width)

A checkpoint is written into ``.tmp-ckpt-…``, fsynced, renamed into place, and only then named in
``LATEST`` (write temp, fsync, rename — the LevelDB manifest switch), so a crash at any moment leaves
the previous checkpoint usable. Older checkpoints are removed after the switch.

Export layout (``--export DIR``): ``sparse-rank{r}-of-{n}.h5`` (datasets "keys" (m,) uint64 and
"values" (m, embedding_dim) float32, the keys rank r owns) and ``dense.h5`` (one dataset per dense
tensor); :func:`load_export` reads every shard back as one model.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np

from ..errors import HpsError, InvalidInputError, StoreFormatError

#: Version of the checkpoint layout, stored in meta.json. Written to disk: never renumber.
CHECKPOINT_VERSION = 1
_LATEST = "LATEST"


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sparse_name(rank: int, size: int) -> str:
    return f"sparse-rank{rank}-of-{size}.h5"


def _write_dense(path: Path, model, dense_opt) -> None:
    import h5py

    with h5py.File(path, "w") as h:
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
    _fsync_path(path)


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


def save(root, coll, store, model, dense_opt, meta: dict) -> str:
    """Write this rank's part of the checkpoint named by ``meta["index"]``; collective over ``coll``."""
    root = Path(root)
    name = f"ckpt-{meta['index']:08d}"
    tmp = root / f".tmp-{name}"
    tmp.mkdir(parents=True, exist_ok=True)
    sparse = tmp / _sparse_name(coll.rank, coll.size)
    store.export_h5(str(sparse))
    _fsync_path(sparse)
    if coll.rank == 0:
        _write_dense(tmp / "dense.h5", model, dense_opt)
        full = dict(meta, ranks=coll.size, row_width=store.dim, version=CHECKPOINT_VERSION)
        (tmp / "meta.json").write_text(json.dumps(full, indent=1))
        _fsync_path(tmp / "meta.json")
    coll.barrier()
    if coll.rank == 0:
        _fsync_path(tmp, directory=True)
        final = root / name
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
        latest_tmp = root / f".{_LATEST}.tmp"
        latest_tmp.write_text(name + "\n")
        _fsync_path(latest_tmp)
        os.rename(latest_tmp, root / _LATEST)
        _fsync_path(root, directory=True)
        for old in root.glob("ckpt-*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
    coll.barrier()
    return str(root / name)


def latest(root) -> Path:
    root = Path(root)
    try:
        name = (root / _LATEST).read_text().strip()
    except FileNotFoundError:
        raise InvalidInputError(f"no checkpoint in {root} (no {_LATEST} file); run once with "
                                "--checkpoint-dir before --resume") from None
    if not re.fullmatch(r"ckpt-\d+", name) or not (root / name).is_dir():
        raise StoreFormatError(f"{root / _LATEST} names {name!r}, which is not a checkpoint directory")
    return root / name


def last_checkpoint(root) -> Path | None:
    """The newest complete checkpoint directory under ``root``, or None when there is none (yet)."""
    try:
        return latest(root)
    except HpsError:
        return None


def load(root, coll, store, model, dense_opt) -> dict:
    """Restore this rank's rows into ``store`` (an empty store) and the dense state -> meta."""
    d = latest(root)
    meta = json.loads((d / "meta.json").read_text())
    if meta.get("version") != CHECKPOINT_VERSION:
        raise StoreFormatError(f"{d} has checkpoint version {meta.get('version')}, expected {CHECKPOINT_VERSION}")
    if meta["ranks"] != coll.size:
        raise InvalidInputError(f"checkpoint {d} was written by {meta['ranks']} ranks; resume with the same "
                                f"number of ranks (got {coll.size})")
    if meta["row_width"] != store.dim:
        raise InvalidInputError(f"checkpoint rows have {meta['row_width']} columns, this run {store.dim}: "
                                "resume with the same --embedding-dim and optimizer")
    store.import_h5(str(d / _sparse_name(coll.rank, coll.size)))
    params, opt = _read_dense(d / "dense.h5")
    model.load_state_dict(params)
    if opt is not None and dense_opt is not None:
        dense_opt.load_state_dict(opt)
    return meta


def export(directory, coll, store, model, emb_dim: int) -> None:
    """Write the trained model (see the module docstring). Collective over ``coll``."""
    import h5py

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    full = d / f".rows-rank{coll.rank}.h5"
    store.export_h5(str(full))
    out = d / _sparse_name(coll.rank, coll.size)
    with h5py.File(full, "r") as src, h5py.File(out, "w") as dst:
        n = src["keys"].shape[0]
        dst.create_dataset("keys", data=src["keys"][()])
        values = dst.create_dataset("values", shape=(n, emb_dim), dtype=np.float32)
        step = 1 << 18
        for a in range(0, n, step):
            values[a:a + step] = src["rows"][a:a + step, :emb_dim]
        dst.attrs["embedding_dim"] = emb_dim
    full.unlink()
    if coll.rank == 0:
        import h5py as _h5

        with _h5.File(d / "dense.h5", "w") as h:
            for k, v in model.state_dict().items():
                h.create_dataset(k, data=v)
    coll.barrier()


def load_export(directory):
    """Read an export back: ``(keys (m,) uint64, values (m, dim) float32, dense {name: array})``."""
    import h5py

    d = Path(directory)
    shards = sorted(d.glob("sparse-rank*-of-*.h5"))
    if not shards:
        raise InvalidInputError(f"{d} holds no sparse-rank*-of-*.h5 files: not an hps export")
    n = int(re.search(r"-of-(\d+)\.h5$", shards[0].name).group(1))
    expected = {_sparse_name(r, n) for r in range(n)}
    names = {s.name for s in shards}
    if names != expected:
        raise StoreFormatError(f"{d}: export shards {sorted(names)} do not match the {n} expected "
                               f"({sorted(expected)})")
    keys, values = [], []
    for r in range(n):
        with h5py.File(d / _sparse_name(r, n), "r") as h:
            keys.append(h["keys"][()])
            values.append(h["values"][()])
    with h5py.File(d / "dense.h5", "r") as h:
        dense = {k: h[k][()] for k in h}
    return np.concatenate(keys), np.concatenate(values), dense
