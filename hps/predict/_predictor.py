"""``Predictor``: score raw data with a model exported by ``python -m hps.train --export DIR``.

The export's ``model.json`` (``hps.train._records``) names the model's architecture and its input:
the data format and the reader options of training (CSV/Parquet columns resolved: the categorical
fields and dense features by name, in order; libsvm's positional field count; Criteo's
``int_as_categorical``). The Predictor reads raw rows with the same readers, so a raw value gets
exactly the key it had in training (docs/predict.md), looks the keys up among the exported rows and
runs the model's forward pass with the exported dense parameters.

A key that is not in the export (never seen in training) gets, by default (``unknown="init"``), the
row training would have created for it — ``RowInitializer(row_params, row_params, seed, scale)``
(small key-seeded uniform values, first-order weight included) — which is also what the training
job's own evaluation scored it with, so the Predictor reproduces the job's eval AUC; with
``unknown="zero"`` it gets a row of zeros (no contribution from that field).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from .._keys import as_keys
from .._written import written_whole
from ..data import DEFAULT_MAX_MALFORMED, Batch, ReaderStats, column_names, is_converted, open_dataset
from ..data import converted_source, expand_paths
from ..errors import InvalidInputError, StoreFormatError
from ..mem import RowInitializer
from ..metrics import auc as auc_score
from ..model import ModelConfig, make_model
from ..table import HashTable
from ..formats import EXPORT_META, read_model

#: What a key missing from the export is scored with.
UNKNOWN_KEYS = ("init", "zero")
#: Examples per batch read while scoring.
DEFAULT_BATCH = 65_536


class Predictor:
    """An exported model, ready to score. ``export_dir``: a directory written by ``--export``, a
    checkpoint of ``--checkpoint-dir`` (``ckpt-…``), or the checkpoint directory itself (its LATEST
    checkpoint: the best model after ``--early-stop``); every file is verified first (a damaged one
    is a one-line CorruptionError naming it). ``unknown``: "init" (default) or "zero", see the
    module docstring; ``warn(message)``: hears that an older export is read unverified (default
    ``warnings.warn``).

    Holds every exported row in a CPU :class:`hps.HashTable` (memory: about 2 x keys x (8 + 4 x
    row_params) bytes). Thread-safe: scoring only reads (the table serialises its own calls)."""

    def __init__(self, export_dir, unknown: str = "init", warn=None):
        if unknown not in UNKNOWN_KEYS:
            raise InvalidInputError(f"unknown must be one of {', '.join(UNKNOWN_KEYS)}, got {unknown!r}")
        d = Path(export_dir)
        meta, (keys, values, dense, first) = read_model(d, warn)  # verified: damage is a CorruptionError
        if "model_config" not in meta:
            raise InvalidInputError(f"{d} has no {EXPORT_META}: not an hps export, or one written before "
                                    "exports recorded their model; export it again with --export")
        self.meta = meta
        self.model = make_model(ModelConfig(**meta["model_config"]))
        self.model.load_state_dict(dense)
        P = self.row_params = int(meta["row_params"])
        rows = values if first is None else np.concatenate([values, first[:, None]], axis=1)
        if rows.shape[1] != P:
            raise StoreFormatError(f"{d}: exported rows have {rows.shape[1]} parameters, model.json says {P}")
        self.table = HashTable(capacity=max(1, keys.shape[0]), dim=P, device="cpu")
        self.table.insert(keys, rows.astype(np.float32, copy=False))
        self.unknown = unknown
        init = meta["init"]
        self._init = RowInitializer(P, P, int(init["seed"]), float(init["scale"]))
        self.format = meta["data"]["format"]
        self.options = dict(meta["data"]["options"])
        self.last_stats = ReaderStats()

    @property
    def n_keys(self) -> int:
        """Keys (rows) in the export."""
        return len(self.table)

    def rows(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Parameter rows of ``keys`` (u,) uint64 -> ``(rows (u, row_params) float32, found (u,) bool)``;
        keys not in the export get the ``unknown`` default. Host arrays; blocking."""
        keys = as_keys(keys)   # a list too: indexed by the found mask below
        rows, found = self.table.get(keys)
        if self.unknown == "init" and not found.all():
            rows[~found] = self._init(keys[~found])
        return rows, found

    def predict_batch(self, batch: Batch) -> np.ndarray:
        """Click probabilities (n,) float32 of a :class:`hps.data.Batch` (keys as the readers make
        them). Blocking."""
        keys, inv = np.unique(batch.keys, return_inverse=True)
        rows, _ = self.rows(keys)
        return np.asarray(self.model.predict(rows, inv.reshape(-1), batch), dtype=np.float32)

    def _read_options(self, data) -> tuple[str, dict, bool]:
        """(format, reader options for ``data``, whether it has labels): the training job's options;
        CSV / Parquet data without the label column is read without one (every label 0); data
        converted by ``python -m hps.convert`` from this model's format and options is read as it is
        (its keys are the ones the model knows; another source's would not be)."""
        if is_converted(data):
            src = converted_source(data)
            keep = ("categorical_columns", "dense_columns", "dense_transform", "dense_stats", "int_as_categorical",
                    "n_fields")
            def settings(opts):  # what decides the keys and dense values; defaults left out
                return {k: v for k, v in opts.items() if k in keep and v not in (None, "none", False, [], ())}

            mine, theirs = settings(self.options), settings(src["options"])
            if src["format"] != self.format or mine != theirs:
                raise InvalidInputError(f"{data} was converted from {src['format']} data with {theirs}; this model "
                                        f"reads {self.format} data with {mine}: the keys would not match")
            return "parquet", {}, True
        if self.format == "synthetic":
            raise InvalidInputError("this model was trained on synthetic data: it has no raw format to "
                                    "read; score Batches with predict_batch")
        opts = dict(self.options)
        if self.format in ("csv", "parquet") and opts.get("label") not in column_names(data, self.format):
            opts["label"] = None
        return self.format, opts, self.format not in ("csv", "parquet") or opts["label"] is not None

    def batches(self, data, batch_size: int = DEFAULT_BATCH, strict: bool = False,
                max_malformed: float = DEFAULT_MAX_MALFORMED, readers: int = 1) -> Iterator[Batch]:
        """Batches of raw ``data`` (files, a directory or a glob, plain, .gz or .zst) read with the
        training job's format and options (see :meth:`_read_options`) by ``readers`` threads;
        ``last_stats`` counts the pass (examples, malformed lines)."""
        fmt, opts, _ = self._read_options(data)
        ds = open_dataset(data, fmt, batch_size, strict=strict, max_malformed=max_malformed, readers=readers, **opts)
        self.last_stats = ds.stats
        for b in ds.batches():
            self.last_stats = ds.stats  # batches() starts a new ReaderStats
            yield b

    def predict(self, data, batch_size: int = DEFAULT_BATCH, **read) -> tuple[np.ndarray, np.ndarray]:
        """``(probabilities (n,) float32, labels (n,) float32)`` of every valid example of ``data``,
        in order (labels 0 when the data has none). Holds the n results in memory; see
        :meth:`write_csv` to stream them to a file."""
        probs, labels = [], []
        for b in self.batches(data, batch_size, **read):
            probs.append(self.predict_batch(b))
            labels.append(b.labels)
        if not probs:
            return np.empty(0, np.float32), np.empty(0, np.float32)
        return np.concatenate(probs), np.concatenate(labels)

    def write_csv(self, data, out, batch_size: int = DEFAULT_BATCH, **read) -> dict:
        """Score ``data`` into the CSV file ``out`` (``label,probability`` per valid example, in input
        order; only ``probability`` when the data has no labels), batch by batch. Returns
        ``{"examples", "malformed", "auc"}`` (auc None without labels or with one class). The scores go
        into a temporary file beside ``out``, renamed over it once every example is scored: a run that
        fails leaves ``out`` as it was. Raises InvalidInputError when ``out`` is one of the data files."""
        out = Path(out)
        if any(out.resolve() == p.resolve() for p in expand_paths(data)):
            raise InvalidInputError(f"--out {out} is one of the --data files: the scores would replace the data; "
                                    "give another file")
        labelled = self._read_options(data)[2]
        labels, probs, n = [], [], 0
        with written_whole(out) as tmp, open(tmp, "w") as f:
            f.write("label,probability\n" if labelled else "probability\n")
            for b in self.batches(data, batch_size, **read):
                p = self.predict_batch(b)
                cols = np.column_stack([b.labels, p]) if labelled else p[:, None]
                np.savetxt(f, cols, fmt=["%d", "%.9g"] if labelled else ["%.9g"], delimiter=",")
                n += len(b)
                if labelled:
                    labels.append(b.labels)
                    probs.append(p)
        auc = None
        if labelled and n:
            y = np.concatenate(labels)
            if 0 < y.sum() < y.shape[0]:
                auc = auc_score(y, np.concatenate(probs))
        return {"examples": n, "malformed": self.last_stats.malformed, "auc": auc}
