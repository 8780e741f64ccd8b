"""CSV reader (Avazu-style): a header line, a named label column, every other column categorical
(unless chosen otherwise: ``hps.data._columns``).

No quoting: a comma always separates columns (Avazu and similar click logs never quote). Per example:

- label: the ``label`` column (default ``"click"``), 1 -> 1, 0 or -1 -> 0.
- dense: the columns named in ``dense_columns``, parsed as numbers (empty -> 0), in that order.
- categorical fields: the columns of ``categorical_columns`` (default: every other column not in
  ``ignore_columns``, in header order); field i's key is ``make_keys(i, fnv1a64(bytes of the
  value))``, an empty value gets ``MISSING_VALUE``.

Every file must start with the same header; every shard's reader reads the header line of each file
(it checks them and finds where each file's data begins).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import InvalidInputError
from ._batch import FIELD_SHIFT, FixedBatch, check_n_fields
from ._chunks import (BAD_COLUMNS, BAD_LABEL, BAD_NUMBER, DEFAULT_CHUNK_BYTES,
                      DEFAULT_MAX_MALFORMED, MISSING_VALUE, TextReader)
from ._columns import plan_columns
from ._dense import SAMPLE_ROWS
from ._parse_kernels import parse_csv
from ._sources import open_source

_CODES = np.array([BAD_COLUMNS, BAD_LABEL, BAD_NUMBER], dtype=np.int32)


def _read_header(path: Path) -> list[str]:
    with open_source(path) as f:
        line = f.readline()
    if not line.strip():
        raise InvalidInputError(f"{path}:1: missing CSV header")
    return [c.strip() for c in line.decode("utf-8", "replace").rstrip("\r\n").split(",")]


class CsvReader(TextReader):
    """Streams ``Batch``es from CSV file(s) with a header (plain, ``.gz`` or ``.zst``). Not
    thread-safe (one iteration at a time).

    Columns (``hps.data._columns.plan_columns``): label: name of the label column (None: no label,
    every label 0); dense_columns: names of numeric columns; ignore_columns: columns to drop (e.g. a
    unique row ``id``); categorical_columns: the fields in field-id order (default: every other
    column, in header order). ``categorical_columns`` then lists the field names in field-id order.
    dense_transform: "none", "log1p" or "standardize" (with ``dense_stats``, else statistics of the
    data's first rows; ``hps.data._dense``). readers: threads parsing in parallel.
    """

    def __init__(self, path, batch_size: int, shard=(0, 1), strict: bool = False,
                 label: str | None = "click", dense_columns: Sequence[str] = (),
                 ignore_columns: Sequence[str] = (), categorical_columns: Sequence[str] | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_malformed: float = DEFAULT_MAX_MALFORMED,
                 readers: int = 1, dense_transform: str = "none", dense_stats: dict | None = None):
        super().__init__(path, batch_size, shard, strict, chunk_bytes, max_malformed, readers)
        self.header = _read_header(self.paths[0])
        for p in self.paths[1:]:
            if _read_header(p) != self.header:
                raise InvalidInputError(f"{p}: header differs from {self.paths[0]}")
        plan = plan_columns(self.header, label, dense_columns, ignore_columns, categorical_columns,
                            where=f"the CSV header of {self.paths[0]}")
        self.categorical_columns = list(plan.categorical)
        self.dense_columns = list(plan.dense)
        self.label = label
        labelled = f"label column {label!r} 0/1 (or -1)" if label is not None else "no label column"
        self.format_description = (f"CSV with the header of {self.paths[0]}: {len(self.header)} "
                                   f"comma-separated columns, {labelled}, dense columns numbers")
        self._kind, self._slot = plan.kind, plan.slot
        self.n_fields = check_n_fields(len(self.categorical_columns), "categorical CSV columns",
                                       low=0)
        self.n_dense = len(self.dense_columns)
        self._setup_dense(dense_transform, dense_stats, lambda: CsvReader(
            self.paths, SAMPLE_ROWS, strict=strict, label=label, dense_columns=dense_columns,
            ignore_columns=ignore_columns, categorical_columns=categorical_columns, chunk_bytes=chunk_bytes,
            max_malformed=max_malformed).batches())

    def _open(self, path: Path):
        f = open_source(path)
        f.readline()  # the header (checked in __init__)
        return f, 2

    def _parse(self, buf: np.ndarray, n_lines: int, bad_line: np.ndarray, bad_code: np.ndarray):
        labels = np.zeros(n_lines, dtype=np.float32)  # stays 0 without a label column
        dense = np.empty((n_lines, self.n_dense), dtype=np.float32)
        keys = np.empty((n_lines, self.n_fields), dtype=np.uint64)
        counts = parse_csv(buf, self._kind, self._slot, self.strict, np.uint64(MISSING_VALUE), _CODES,
                           FIELD_SHIFT, labels, dense, keys, bad_line, bad_code)
        n_ok = counts[1]
        return counts, FixedBatch(labels[:n_ok], dense[:n_ok], keys[:n_ok])
