"""What a run records about itself: in the metrics JSON (the resolved configuration, the hps version,
the data files read, a run name the plots carry) and in the export (what ``hps.Predictor`` needs to
turn raw rows into the keys the model was trained on).

``EXPORT_META`` (``model.json`` in the export directory, and in every checkpoint) holds::

    {"export_version": EXPORT_VERSION, "hps_version": "...",
     "model_config": {ModelConfig fields},             # the architecture, rebuilt by the Predictor
     "row_params": P, "init": {"seed": s, "scale": c},  # how a key unseen in training is born
     "data": {"format": "...", "options": {...},        # reader options: columns, libsvm n_fields, ...
              "n_fields": F, "n_dense": D}}

and, written by the export (``_export``): ``"batch"`` (the global batch the model is from),
``"source"`` (``"end of training"`` or the checkpoint exported), ``"eval_auc"`` (its evaluation
during training, when one was made), ``"files"`` (size and CRC-32 of each file) and ``"crc32"``.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from ..data import expand_paths
from ..formats import EXPORT_VERSION


def _jsonable(value):
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def data_files(data) -> list[str]:
    """The files ``--data`` / ``--eval-data`` expand to, in reading order ([] when unset)."""
    return [str(p) for p in expand_paths(data)] if data else []


def run_name(cfg, started: float | None = None) -> str:
    """A short name of the run for figure titles: model, format, data and the UTC start time."""
    d = cfg.data
    files = data_files(d.data) if d.format != "synthetic" else []
    what = Path(files[0]).name + (f" +{len(files) - 1} files" if len(files) > 1 else "") if files else \
        f"{d.rows:,} rows"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started if started is not None else time.time()))
    return f"{cfg.model.model} on {d.format} {what}, {stamp}"


def run_record(cfg, started: float | None = None) -> dict:
    """Metrics keys of the run's own record: ``config`` (every option, defaults resolved),
    ``hps_version``, ``data_files``, ``eval_data_files`` and ``run_name``."""
    from .. import __version__

    return {"config": _jsonable(dataclasses.asdict(cfg)), "hps_version": __version__,
            "data_files": data_files(cfg.data.data) if cfg.data.format != "synthetic" else [],
            "eval_data_files": data_files(cfg.data.eval_data) if cfg.data.format != "synthetic" else [],
            "run_name": run_name(cfg, started)}


def export_meta(cfg, feed, model, format_options: dict) -> dict:
    """The ``EXPORT_META`` record of a trained ``model`` read from ``feed`` with ``format_options``
    (the reader options of ``cfg.data.format``); CSV/Parquet columns are written resolved."""
    from .. import __version__

    opts = {k: v for k, v in format_options.items() if k not in ("seed", "block_rows")}
    reader = feed.readers[0]
    fmt = cfg.data.format
    if getattr(feed, "source", None):  # converted data (hps.convert): its keys are those of its source's format
        fmt, opts = feed.source[0], dict(feed.source[1])
    if fmt in ("csv", "parquet"):
        opts.update(categorical_columns=list(reader.categorical_columns), dense_columns=list(reader.dense_columns),
                    ignore_columns=[])
    if fmt == "libsvm":
        opts["n_fields"] = feed.n_fields
    return {"export_version": EXPORT_VERSION, "hps_version": __version__,
            "model_config": _jsonable(dataclasses.asdict(model.cfg)), "row_params": model.row_params,
            "init": {"seed": cfg.train.seed, "scale": cfg.model.init_scale},
            "data": {"format": fmt, "options": _jsonable(opts), "n_fields": feed.n_fields,
                     "n_dense": feed.n_dense}}


def describe_model(model, row_width: int, sparse_opt: str, dense_opt: str) -> str:
    """One line: ``model``'s architecture, its dense parameter count (``dense_opt``: the dense optimizer's
    name) and the layout of a row of ``row_width`` floats (``sparse_opt``: the row optimizer's name)."""
    dense = sum(int(p.size) for p in model.params.values())
    state = row_width - model.row_params
    row = (f"{model.emb_dim} embedding" + (" + 1 first-order weight" if model.first_order else "")
           + (f" + {state} {sparse_opt} state" if state else ""))
    return (f"model: {model.describe()}; {dense:,} dense parameters ({dense_opt}); "
            f"one row of {row_width} floats ({row}) per key, made on first use")
