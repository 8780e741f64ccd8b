"""``open_dataset``: one entry point for every data format."""

from __future__ import annotations

from ..errors import InvalidInputError
from ._chunks import DEFAULT_MAX_MALFORMED
from ._converted import ConvertedReader, file_meta, is_converted
from ._criteo import CriteoReader
from ._csv import CsvReader
from ._libsvm import LibsvmReader
from ._parquet import ParquetReader
from ._synthetic import SyntheticData

#: Format name -> dataset class. Every class offers ``batches(start_batch=0)``, ``probe()`` (a
#: check of the data's first bytes, raising if they are unusable), ``stats``, ``n_fields`` and
#: ``n_dense``.
FORMATS = {
    "criteo": CriteoReader,
    "libsvm": LibsvmReader,
    "csv": CsvReader,
    "parquet": ParquetReader,
    "synthetic": SyntheticData,
}


def open_dataset(path, fmt: str, batch_size: int, shard=(0, 1), strict: bool = False,
                 max_malformed: float = DEFAULT_MAX_MALFORMED, **fmt_options):
    """Dataset of ``fmt`` over ``path`` (a file, a directory, a glob or a list of them, plain or
    ``.gz`` / ``.zst``: ``hps.data._sources``; ignored for "synthetic").

    fmt_options go to the format's class: criteo ``int_as_categorical``; libsvm ``n_fields``;
    csv and parquet ``label``, ``dense_columns``, ``ignore_columns``, ``categorical_columns``,
    ``dense_transform``, ``dense_stats`` (``hps.data._dense``);
    file formats ``chunk_bytes``; synthetic
    ``rows``, ``fields``, ``vocab_per_field``, ``zipf``, ``n_dense``, ``seed``, ``eval_rows``; every
    format ``readers`` (threads parsing or generating in parallel, ``hps.data._parallel``). "parquet"
    data written by ``python -m hps.convert`` is read as such (:class:`ConvertedReader`).
    strict/max_malformed: how many malformed lines a text format's pass may skip (``TextReader``).
    Raises ``InvalidInputError`` for an unknown format or option and ``DataFileNotFoundError`` (an
    ``InvalidInputError`` and a ``FileNotFoundError``) for a missing file.
    """
    cls = FORMATS.get(fmt)
    if cls is None:
        raise InvalidInputError(f"unknown data format {fmt!r}; valid formats: "
                                f"{', '.join(sorted(FORMATS))}")
    try:
        if cls is SyntheticData:
            # synthetic data has no malformed lines: ``strict``/``max_malformed`` do not apply
            return SyntheticData(batch_size=batch_size, shard=shard, **fmt_options)
        if path is None:
            raise InvalidInputError(f"format {fmt!r} needs a data path")
        if cls is ParquetReader and is_converted(path):
            cls = ConvertedReader
        return cls(path, batch_size, shard=shard, strict=strict, max_malformed=max_malformed,
                   **fmt_options)
    except TypeError as e:
        if "unexpected keyword argument" in str(e):
            raise InvalidInputError(f"format {fmt!r}: {e}") from None
        raise


def column_names(path, fmt: str) -> list[str] | None:
    """The column names of the first file of ``path`` for "csv" (its header) and "parquet" (its
    schema); None for the formats without named columns."""
    from ._sources import expand_paths

    first = expand_paths(path)[0]
    if fmt == "csv":
        from ._csv import _read_header

        return _read_header(first)
    if fmt == "parquet":
        if is_converted(first):  # the columns of its source (it always has its labels)
            src = file_meta(first)["source"].get("options", {})
            return ([src["label"]] if src.get("label") else []) + list(src.get("categorical_columns") or []) \
                + list(src.get("dense_columns") or [])
        return list(ParquetReader._meta(first).schema.to_arrow_schema().names)
    return None


def format_options(d, seed: int, batch_size: int) -> dict:
    """The reader options (``open_dataset``'s ``fmt_options``) of the data part ``d`` of a job (an
    ``hps.config.DataConfig``) with ``seed`` and global ``batch_size``. Synthetic data is generated in
    blocks of the global batch size: the same data for any number of shards."""
    if d.format == "synthetic":
        return {"rows": d.rows, "fields": d.fields, "vocab_per_field": d.vocab_per_field, "zipf": d.zipf,
                "n_dense": d.n_dense, "seed": seed, "block_rows": batch_size, "drift": d.drift}
    if d.format == "libsvm" and d.libsvm_fields:
        return {"n_fields": d.libsvm_fields}
    if d.format in ("csv", "parquet"):
        return {"label": d.label_column, "ignore_columns": d.ignore_columns, "dense_columns": d.dense_columns,
                "categorical_columns": d.categorical_columns, "dense_transform": d.dense_transform}
    if d.format == "criteo":
        return {"int_as_categorical": d.int_as_categorical}
    return {}
