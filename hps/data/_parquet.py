"""Parquet reader (through pyarrow), and the column work every Arrow table source shares.

Columns are chosen as for CSV (``hps.data._columns``: ``label``, ``dense_columns``,
``ignore_columns``, ``categorical_columns``), and a value becomes what the CSV reader makes of the
same text:

- label: a numeric or boolean column, 1 -> 1, 0 or -1 -> 0; anything else (or null) is malformed;
- dense: numeric or boolean columns as float32, null -> 0; NaN, inf or beyond float32's range is
  malformed;
- categorical field i: the value as text (Arrow's cast to string: integers in decimal, strings and
  binary as they are) hashed with FNV-1a 64, key ``make_keys(i, fnv1a64(text))``; null or empty ->
  ``MISSING_VALUE``. So a string or integer column gives the same keys in Parquet as in CSV.

Streaming: the files are read ``rows_per_read`` rows at a time (``ParquetFile.iter_batches`` over the
row groups a shard needs, only the columns used); nothing holds a whole file. Sharding: the rows of
all files, laid end to end, are cut into ``K`` runs of equal length (``share_bounds``); shard ``s``
reads the row groups its run overlaps and keeps its rows. A Parquet file is compressed inside (its
pages), so ``.gz`` / ``.zst`` around one is refused. Malformed rows are named ``file:row``
(1-based row of the file). Not thread-safe (one iteration at a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..errors import InvalidInputError
from ._batch import FIELD_SHIFT, FixedBatch, check_n_fields
from ._chunks import (BAD_LABEL, BAD_NUMBER, DEFAULT_CHUNK_BYTES, DEFAULT_MAX_MALFORMED,
                      MAX_RECORDED_MALFORMED, MISSING_VALUE, REASONS, TextReader)
from ._columns import ColumnPlan, plan_columns
from ._dense import SAMPLE_ROWS
from ._parse_kernels import hash_strings
from ._shards import Segment, row_segments, share_bounds
from ._sources import compression

#: Bytes of ``chunk_bytes`` per row read: a read is ``chunk_bytes // BYTES_PER_ROW`` rows (65,536 at
#: the default 16 MiB).
BYTES_PER_ROW = 256
_F32_MAX = float(np.finfo(np.float32).max)


def _arrow():
    import pyarrow as pa
    import pyarrow.compute as pc

    return pa, pc


def _plain(arr):
    """A dictionary-encoded Arrow array decoded; others as they are."""
    pa, _ = _arrow()
    return arr.dictionary_decode() if pa.types.is_dictionary(arr.type) else arr


def _numbers(arr, name: str, null: float | None = None) -> np.ndarray:
    """(n,) float64 of a numeric/boolean Arrow array, NaN where null (``null``: that value instead; filled
    after the cast, so a boolean column with nulls fills too)."""
    pa, pc = _arrow()
    try:
        x = pc.cast(_plain(arr), pa.float64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"column {name!r} ({arr.type}) is not numeric: {e}") from None
    if null is not None and x.null_count:
        x = pc.fill_null(x, null)
    return x.to_numpy(zero_copy_only=False)


def text_buffers(arr):
    """An Arrow array of n entries as text, zero-copy where it already is: ``(data (b,) uint8,
    offsets (n+1,) int64 into data, valid (n,) bool)`` host arrays (integers in decimal, strings and
    binary as stored; Arrow's cast to string)."""
    pa, pc = _arrow()
    arr = _plain(arr)
    t = arr.type
    binary = pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)
    arr = pc.cast(arr, pa.large_binary() if binary else pa.large_string())
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], np.int64, count=n + 1, offset=arr.offset * 8)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and bufs[2].size else np.zeros(1, np.uint8)
    valid = (arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count
             else np.ones(n, dtype=np.bool_))
    return data, offsets, valid


def hash_column(arr, keys: np.ndarray, col: int, missing: int = MISSING_VALUE) -> None:
    """Fill ``keys[:, col]`` (n, F) uint64 with the keys of field ``col``: the FNV-1a hash of each
    entry's text (see the module docstring). arr: an Arrow array of n entries. Blocking."""
    hash_strings(*text_buffers(arr), np.uint64(missing), FIELD_SHIFT, keys, col)


def arrow_examples(rb, plan: ColumnPlan):
    """Column work of one Arrow RecordBatch ``rb`` (n rows; the columns ``plan`` uses, by name) ->
    ``(labels (n,) float32, dense (n, D) float32, keys (n, F) uint64, code (n,) int32)``, code 0
    for a valid row, else BAD_LABEL / BAD_NUMBER. Host arrays; blocking; thread-safe."""
    n = rb.num_rows
    code = np.zeros(n, dtype=np.int32)
    labels = np.zeros(n, dtype=np.float32)
    if plan.label is not None:
        y = _numbers(rb.column(plan.label), plan.label)
        code[~((y == 1.0) | (y == 0.0) | (y == -1.0))] = BAD_LABEL
        labels[y == 1.0] = 1.0
    dense = np.empty((n, len(plan.dense)), dtype=np.float32)
    for j, name in enumerate(plan.dense):
        x = _numbers(rb.column(name), name, null=0.0)
        bad = ~(np.abs(x) < _F32_MAX)  # NaN, inf and beyond float32
        code[bad & (code == 0)] = BAD_NUMBER
        dense[:, j] = np.where(bad, 0.0, x)
    keys = np.empty((n, len(plan.categorical)), dtype=np.uint64)
    for j, name in enumerate(plan.categorical):
        hash_column(rb.column(name), keys, j)
    return labels, dense, keys, code


class ParquetReader(TextReader):
    """Streams ``Batch``es from Parquet file(s) (see the module docstring). ``label``,
    ``dense_columns``, ``ignore_columns``, ``categorical_columns``, ``dense_transform`` and
    ``dense_stats`` as for :class:`CsvReader`.
    ``rows`` is the rows of all files (from their footers)."""

    def __init__(self, path, batch_size: int, shard=(0, 1), strict: bool = False,
                 label: str | None = "click", dense_columns: Sequence[str] = (),
                 ignore_columns: Sequence[str] = (), categorical_columns: Sequence[str] | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_malformed: float = DEFAULT_MAX_MALFORMED,
                 readers: int = 1, dense_transform: str = "none", dense_stats: dict | None = None):
        super().__init__(path, batch_size, shard, strict, chunk_bytes, max_malformed, readers)
        pa, _ = _arrow()
        for p in self.paths:
            if compression(p):
                raise InvalidInputError(f"{p}: a Parquet file is compressed inside; give the .parquet "
                                        "file itself, not a .gz / .zst of it")
        metas = [self._meta(p) for p in self.paths]
        schema = metas[0].schema.to_arrow_schema()
        self.header = list(schema.names)
        for p, m in zip(self.paths[1:], metas[1:]):
            if list(m.schema.to_arrow_schema().names) != self.header:
                raise InvalidInputError(f"{p}: columns differ from {self.paths[0]} ({self.header})")
        plan = plan_columns(self.header, label, dense_columns, ignore_columns, categorical_columns,
                            where=f"the Parquet schema of {self.paths[0]}")
        for name in ([label] if label is not None else []) + list(plan.dense):
            t = schema.field(name).type
            if pa.types.is_dictionary(t):
                t = t.value_type
            if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
                    or pa.types.is_decimal(t)):
                raise InvalidInputError(f"{self.paths[0]}: column {name!r} is {t}; the label and dense "
                                        "columns must be numeric or boolean")
        for name in plan.categorical:  # hashed as text: a list, struct or map has none
            if pa.types.is_nested(schema.field(name).type):
                raise InvalidInputError(f"{self.paths[0]}: column {name!r} is {schema.field(name).type}; a "
                                        "categorical column must hold one value a row (numbers, text or "
                                        "binary): leave it out with --ignore-columns")
        self._plan = plan
        self.label = label
        self.categorical_columns, self.dense_columns = list(plan.categorical), list(plan.dense)
        self.n_fields = check_n_fields(len(plan.categorical), "categorical Parquet columns", low=0)
        self.n_dense = len(plan.dense)
        self._group_rows = [[m.row_group(i).num_rows for i in range(m.num_row_groups)] for m in metas]
        self.rows = sum(sum(g) for g in self._group_rows)
        labelled = f"label column {label!r} 0/1 (or -1)" if label is not None else "no label column"
        self.format_description = (f"Parquet with the columns of {self.paths[0]}: {labelled}, dense "
                                   "columns numbers")
        self._setup_dense(dense_transform, dense_stats, lambda: ParquetReader(
            self.paths, SAMPLE_ROWS, strict=strict, label=label, dense_columns=dense_columns,
            ignore_columns=ignore_columns, categorical_columns=categorical_columns, chunk_bytes=chunk_bytes,
            max_malformed=max_malformed).batches())

    @staticmethod
    def _meta(path):
        import pyarrow.parquet as pq

        pa, _ = _arrow()
        try:
            return pq.ParquetFile(path).metadata
        except (pa.ArrowInvalid, OSError) as e:
            raise InvalidInputError(f"{path} is not a Parquet file ({e})") from None

    def segments(self) -> list[Segment]:
        """Row ranges ``[start, stop)`` (rows of one file) of this shard."""
        lo, hi = share_bounds(self.rows, self.shard, self.n_shards)
        return row_segments(self.paths, [sum(g) for g in self._group_rows], lo, hi)

    def _units(self, seg: Segment, chunk_bytes: int, max_chunks: int | None = None) -> Iterator[_Rows]:
        """Record batches of ``chunk_bytes // BYTES_PER_ROW`` rows of one segment (decoded by
        pyarrow, with its threads, in the iterating thread), in order. A file that cannot be decoded
        raises InvalidInputError naming it."""
        groups = self._group_rows[self.paths.index(seg.path)]
        starts = np.concatenate([[0], np.cumsum(groups)]).astype(np.int64)
        use = [i for i in range(len(groups)) if starts[i] < seg.stop and starts[i + 1] > seg.start]
        if not use:
            return
        columns = [c for c, k in zip(self.header, self._plan.kind) if k != 3]  # not IGNORE
        row = int(starts[use[0]])
        rows_per_read = max(1, chunk_bytes // BYTES_PER_ROW)
        pa, _ = _arrow()
        try:
            yield from self._record_batches(seg, use, columns, row, rows_per_read, max_chunks)
        except (pa.ArrowException, OSError) as e:  # a damaged page, a file cut short since it was opened
            raise InvalidInputError(f"{seg.path} cannot be read ({e}); check the file, or leave it out") from None

    def _record_batches(self, seg: Segment, use: list, columns: list, row: int, rows_per_read: int,
                        max_chunks: int | None) -> Iterator[_Rows]:
        """:meth:`_units` of the row groups ``use`` of ``seg`` (the first starting at ``row``)."""
        import pyarrow.parquet as pq

        with pq.ParquetFile(seg.path) as pf:
            for k, rb in enumerate(pf.iter_batches(batch_size=rows_per_read, row_groups=use, columns=columns)):
                a, b = max(seg.start, row), min(seg.stop, row + rb.num_rows)
                first = row
                row += rb.num_rows
                if a >= b:
                    if row >= seg.stop:
                        return
                    continue
                if max_chunks is not None and k >= max_chunks:
                    self._cut = True
                    return
                yield _Rows(rb.slice(a - first, b - a), str(seg.path), a)
                if row >= seg.stop:
                    return

    def _work(self, unit: _Rows):
        """The column work of one record batch: (its valid rows as a FixedBatch, code (n,) int32)."""
        labels, dense, keys, code = arrow_examples(unit.rb, self._plan)
        dense = self._transformed(FixedBatch(labels, dense, keys)).dense
        ok = code == 0
        if ok.all():
            return FixedBatch(labels, dense, keys), code
        return FixedBatch(labels[ok], dense[ok], keys[ok]), code

    def _accept(self, unit: _Rows, result) -> FixedBatch:
        """Counts one record batch into ``stats`` (and checks it), in order; returns its part."""
        part, code = result
        n, n_ok = code.shape[0], len(part)
        st = self.stats
        st.lines += n
        st.examples += n_ok
        st.malformed += n - n_ok
        st.bytes += unit.rb.nbytes
        if n_ok < n:
            bad = np.flatnonzero(code)
            for i in bad[:max(0, MAX_RECORDED_MALFORMED - len(st.malformed_at))]:
                st.malformed_at.append((unit.path, unit.first_row + int(i) + 1, REASONS[int(code[i])]))
            if self.strict:
                i = int(bad[0])
                raise InvalidInputError(f"{unit.path}:{unit.first_row + i + 1}: malformed row "
                                        f"({REASONS[int(code[i])]}); expected {self.format_description}")
        self._check(st, final=False)
        return part

    def _after(self, unit, result) -> None:
        pass


@dataclass(frozen=True)
class _Rows:
    """One work unit of the Parquet reader: record batch ``rb`` of ``path``, whose first row is row
    ``first_row`` (0-based) of the file."""

    rb: object
    path: str
    first_row: int
