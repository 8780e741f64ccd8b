"""Parquet written by ``python -m hps.convert``: keys already hashed, read without parsing or hashing.

Layout (``LAYOUT_VERSION``; written to disk, never renumber), every column required (no nulls):

- ``label`` float32;
- ``dense`` fixed_size_list<float32, D> (only when D > 0): the dense features as the source's reader
  makes them (Criteo's log1p included);
- one key per field and weight 1 (every format but libsvm): ``keys`` fixed_size_list<uint64, F>,
  example i's keys in field order — read as one zero-copy (n, F) array; libsvm: ``keys``
  list<uint64> and ``weights`` list<float32> (a key's field is in its top bits, ``make_keys``).
  (One list column reads as fast as 26 uint64 columns and needs no transpose into examples.)
- the schema's metadata ``hps``: JSON with ``layout``, ``hashing`` (``HASHING_VERSION`` of the hps
  that hashed the keys), ``conversion`` (an id shared by the files of one conversion), ``file`` (its
  index), ``n_fields``, ``n_dense``, ``fixed_width`` and ``source`` (the source's format and resolved
  reader options: what keys the data holds).

Files are ``part-00000.parquet``, … in one directory with ``MANIFEST`` (``.hps-convert.json``,
hidden, so a directory lists only the data): the conversion's id and versions, every file with its
rows and bytes, and ``shards``: for K = 1 … the conversion's ``max_shards``, the row at which each
of the K shards of the source begins — the rows ``--data-shards K`` (or K ranks) would read from
the source. Row groups (``ROW_GROUP_ROWS`` rows) are cut at those rows, so a shard reads whole row
groups and a run on the converted data composes exactly the source's global mini-batches. Pages
carry CRC-32 checksums, verified as they are read.

:class:`ConvertedReader` reads such data for ``open_dataset(path, "parquet")``. Before any row is
read it checks every file's footer and metadata against the others and against this hps, and — given
the directory — against the manifest (no file missing, none added, none cut short): a damaged or
foreign file, one from another conversion, or keys hashed by another hashing version is one
``InvalidInputError`` naming the file. Work units are row groups, read and turned into batches by
``readers`` threads (pyarrow releases the GIL).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..errors import InvalidInputError
from ._batch import FIELD_SHIFT, HASHING_VERSION, Batch, FixedBatch
from ._chunks import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_MALFORMED, TextReader, cut_at_batches
from ._shards import Segment, row_segments, share_bounds

#: Version of the layout above. Written into every file and the manifest: never renumber.
LAYOUT_VERSION = 1
#: Key of the schema metadata holding the conversion's JSON record.
META_KEY = b"hps"
#: The manifest of a converted directory (a dot file: ``expand_paths`` lists only the data).
MANIFEST = ".hps-convert.json"
#: Rows of a row group (cut earlier at a shard's first row): 65,536 rows of 26 keys are 14 MB.
ROW_GROUP_ROWS = 1 << 16
#: ``hps.convert``: shards up to which a conversion keeps the source's shards exactly (``hps.convert._write``).
DEFAULT_MAX_SHARDS = 8
#: ``hps.convert``: compression of the pages: none reads fastest (hashed keys hardly compress;
#: ``bench/bench_feed.py``).
COMPRESSIONS = ("none", "snappy", "zstd")
#: Options of the CSV/Parquet readers a converted directory answers itself (its columns are fixed).
COLUMN_OPTIONS = ("dense_columns", "ignore_columns", "categorical_columns")


def file_meta(path) -> dict | None:
    """The ``hps`` metadata of the Parquet file ``path`` (None: not written by hps.convert). Raises
    InvalidInputError when ``path`` is not a readable Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise InvalidInputError(f"{path} is not a Parquet file ({e}): a damaged, truncated or foreign file") \
            from None
    raw = (meta.metadata or {}).get(META_KEY)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise InvalidInputError(f"{path}: its hps metadata is not JSON: a damaged file") from None


def is_converted(path) -> bool:
    """Whether the first data file of ``path`` was written by hps.convert."""
    from ._sources import expand_paths

    first = expand_paths(path)[0]
    return first.suffix.lower() in (".parquet", ".parq") and file_meta(first) is not None


def converted_source(path) -> dict:
    """``{"format", "options"}``: the source of the converted data ``path`` (what keys it holds)."""
    from ._sources import expand_paths

    return file_meta(expand_paths(path)[0])["source"]


def read_manifest(directory: Path) -> dict | None:
    p = Path(directory) / MANIFEST
    if not p.is_file():
        return None
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise InvalidInputError(f"{p}: unreadable manifest ({e}): convert the data again") from None


class ConvertedReader(TextReader):
    """Streams ``Batch``es from a directory (or files) written by ``python -m hps.convert`` (see the
    module docstring). ``shard=(s, K)``: the rows the source's shard s of K holds when the
    conversion recorded K (``max_shards``), else the K-th share of the rows. ``label`` is the
    converted label; the column options and the dense transform must match the conversion's (its
    columns are fixed, its dense values already transformed).
    ``strict``, ``max_malformed`` and ``chunk_bytes`` have nothing to do (no row is malformed).
    Not thread-safe (one iteration at a time)."""

    format_description = "Parquet written by python -m hps.convert"

    def __init__(self, path, batch_size: int, shard=(0, 1), strict: bool = False, label: str | None = "click",
                 dense_columns: Sequence[str] = (), ignore_columns: Sequence[str] = (),
                 categorical_columns: Sequence[str] | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_malformed: float = DEFAULT_MAX_MALFORMED, readers: int = 1, dense_transform: str = "none",
                 dense_stats: dict | None = None):
        super().__init__(path, batch_size, shard, strict, chunk_bytes, max_malformed, readers)
        first = self._checked(self.paths[0], None)
        for p in self.paths[1:]:
            self._checked(p, first)
        self.meta = first
        self.source = first["source"]
        self.n_fields, self.n_dense = int(first["n_fields"]), int(first["n_dense"])
        self.fixed_width = bool(first["fixed_width"])
        given = {"dense_columns": list(dense_columns or ()), "ignore_columns": list(ignore_columns or ()),
                 "categorical_columns": None if categorical_columns is None else list(categorical_columns)}
        src = self.source.get("options", {})
        for name in COLUMN_OPTIONS:  # the conversion fixed the columns: another choice is an error
            if given[name] and name in src and given[name] != src[name]:
                raise InvalidInputError(f"{self.paths[0].parent}: converted from {self.source['format']} with "
                                        f"{name} {src[name]}, not {given[name]}: convert the source again "
                                        "to change the columns")
        done = src.get("dense_transform", "none")  # applied by the conversion: the stored values are transformed
        if dense_transform not in ("none", done):
            raise InvalidInputError(f"{self.paths[0].parent}: converted with --dense-transform {done}, not "
                                    f"{dense_transform}: convert the source again to change it")
        self.dense_transform, self.dense_stats = done, src.get("dense_stats")
        if dense_stats is not None and done == "standardize" and dense_stats != self.dense_stats:
            # the training data's statistics (eval data, predict): the stored values were standardized with
            # other ones, so they would be scored on another scale
            raise InvalidInputError(f"{self.paths[0].parent} was standardized (--dense-transform standardize) "
                                    "with its own dense statistics, not those of the training data: give its "
                                    "source data (standardized with the training data's), or convert it without "
                                    "--dense-transform")
        self.categorical_columns = list(src.get("categorical_columns") or [])
        self.dense_columns = list(src.get("dense_columns") or [])
        self.label = label
        self._groups = [self._row_groups(p) for p in self.paths]
        self.rows = sum(sum(g) for g in self._groups)
        self._cuts = self._shard_cuts(path)

    # -- checks ----------------------------------------------------------------------------------
    def _checked(self, p: Path, first: dict | None) -> dict:
        """The metadata of ``p``, checked against this hps and (``first``) the first file's."""
        m = file_meta(p)
        if m is None:
            raise InvalidInputError(f"{p} was not written by python -m hps.convert, but {self.paths[0]} was: "
                                    "a converted directory holds only its own files")
        if m.get("layout") != LAYOUT_VERSION:
            raise InvalidInputError(f"{p}: layout version {m.get('layout')} of python -m hps.convert; this hps "
                                    f"reads version {LAYOUT_VERSION}: convert the source data again")
        if m.get("hashing") != HASHING_VERSION:
            raise InvalidInputError(f"{p}: its keys were hashed by hps hashing version {m.get('hashing')}, this "
                                    f"hps hashes with version {HASHING_VERSION}: the keys would not match; "
                                    "convert the source data again with this hps")
        if first is not None and m.get("conversion") != first.get("conversion"):
            raise InvalidInputError(f"{p} is from another conversion ({m.get('conversion')}) than "
                                    f"{self.paths[0]} ({first.get('conversion')}): give one conversion's files")
        return m

    def _row_groups(self, p: Path) -> list[int]:
        import pyarrow.parquet as pq

        meta = pq.read_metadata(p)
        names = list(meta.schema.to_arrow_schema().names)
        want = ["label"] + (["dense"] if self.n_dense else []) + ["keys"] + ([] if self.fixed_width else ["weights"])
        if names != want:
            raise InvalidInputError(f"{p}: columns {names} are not those hps.convert writes ({want}): a "
                                    "foreign or altered file")
        return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]

    def _shard_cuts(self, path) -> dict | None:
        """The recorded shard cuts when this reader has all of the conversion's files; checks the
        files against the manifest (all of them when given the directory)."""
        directory = self.paths[0].parent
        man = read_manifest(directory)
        if man is None:
            raise InvalidInputError(f"{directory} has no {MANIFEST}: not a complete conversion (copy the "
                                    "directory whole, or convert the source again)")
        if man.get("conversion") != self.meta.get("conversion"):
            raise InvalidInputError(f"{directory / MANIFEST} belongs to conversion {man.get('conversion')}, "
                                    f"its files to {self.meta.get('conversion')}: convert the source again")
        listed = {f["name"]: f for f in man["files"]}
        for p in self.paths:
            entry = listed.get(p.name)
            if entry is None or p.parent != directory:
                raise InvalidInputError(f"{p} is not a file of the conversion in {directory}")
            if p.stat().st_size != entry["bytes"]:
                raise InvalidInputError(f"{p} has {p.stat().st_size} bytes, the conversion wrote {entry['bytes']}: "
                                        "a damaged or truncated file")
        whole = isinstance(path, (str, os.PathLike)) and Path(path).is_dir()
        names = [p.name for p in self.paths]
        if whole or sorted(names) == sorted(listed):
            missing = [n for n in listed if n not in names]
            if missing:
                raise InvalidInputError(f"{directory / missing[0]} is missing: the conversion wrote "
                                        f"{len(listed)} files; convert the source again")
            if names == [f["name"] for f in man["files"]]:
                return {int(k): v for k, v in man.get("shards", {}).items()}
        return None

    # -- reading -----------------------------------------------------------------------------------
    def segments(self) -> list[Segment]:
        """Row ranges ``[start, stop)`` (rows of one file) of this shard."""
        cuts = (self._cuts or {}).get(self.n_shards)
        lo, hi = (cuts[self.shard], cuts[self.shard + 1]) if cuts else share_bounds(self.rows, self.shard,
                                                                                     self.n_shards)
        return row_segments(self.paths, [sum(g) for g in self._groups], lo, hi)

    def _units(self, seg: Segment, chunk_bytes: int, max_chunks: int | None = None) -> Iterator[_Group]:
        groups = self._groups[self.paths.index(seg.path)]
        start = 0
        k = 0
        for g, n in enumerate(groups):
            a, b = max(seg.start, start), min(seg.stop, start + n)
            if a < b:
                if max_chunks is not None and k >= max_chunks:
                    self._cut = True
                    return
                yield _Group(seg.path, g, a - start, b - start, self._pass_rows)
                self._pass_rows += b - a
                k += 1
            start += n

    def _work(self, unit: _Group):
        """One row group's rows [a, b) as a FixedBatch (a Batch for libsvm data). Thread-safe."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            with pq.ParquetFile(unit.path, page_checksum_verification=True) as pf:
                t = pf.read_row_group(unit.group, use_threads=False)
        except (pa.ArrowException, OSError) as e:
            raise InvalidInputError(f"{unit.path}: row group {unit.group} is damaged ({e}); convert the "
                                    "source data again") from None
        t = t.slice(unit.a, unit.b - unit.a).combine_chunks()
        n = t.num_rows
        labels = _numpy(t.column("label").chunk(0), np.float32) if n else np.empty(0, np.float32)
        dense = (_values(t.column("dense"), np.float32).reshape(n, self.n_dense) if self.n_dense
                 else np.zeros((n, 0), np.float32))
        keys_col = t.column("keys")
        if self.fixed_width:
            part = FixedBatch(labels, dense, _values(keys_col, np.uint64).reshape(n, self.n_fields))
            return cut_at_batches(part, unit.first, self.batch_size)  # whole batches built here, in parallel
        offsets = np.zeros(1, np.int64)
        if n:
            offsets = keys_col.chunk(0).offsets.to_numpy().astype(np.int64)
            offsets -= offsets[0]  # a slice's offsets start where its first list does
        keys = _values(keys_col, np.uint64)
        weights = _values(t.column("weights"), np.float32)
        return Batch(labels, dense, keys, (keys >> np.uint64(FIELD_SHIFT)).astype(np.int32), weights, offsets,
                     self.n_fields)

    def _accept(self, unit: _Group, part):
        st = self.stats
        for p in part if isinstance(part, list) else [part]:
            st.lines += len(p)
            st.examples += len(p)
            st.bytes += p.keys.nbytes + p.dense.nbytes + p.labels.nbytes
        return part

    def _after(self, unit, result) -> None:
        pass


def _values(col, dtype) -> np.ndarray:
    """The flat values of a (one-chunk) list column as a writable NumPy array (see :func:`_numpy`)."""
    if col.num_chunks == 0 or len(col) == 0:
        return np.empty(0, dtype)
    return _numpy(col.chunk(0).flatten(), dtype)


def _numpy(arr, dtype) -> np.ndarray:
    """A primitive Arrow array without nulls as a NumPy array of ``dtype``: a zero-copy view of the
    buffer the Parquet reader filled (it is mutable, so the view is writable like every other batch's
    arrays — kernels see one array type), a copy otherwise."""
    buf = arr.buffers()[1]
    item = np.dtype(dtype).itemsize
    if buf is not None and buf.is_mutable and arr.type.bit_width == 8 * item:
        return np.frombuffer(buf, dtype=dtype, count=len(arr), offset=arr.offset * item)
    return arr.to_numpy(zero_copy_only=False).astype(dtype)


@dataclass(frozen=True)
class _Group:
    """One work unit: rows [a, b) of row group ``group`` of ``path``, the first of them row ``first``
    of the pass."""

    path: Path
    group: int
    a: int
    b: int
    first: int
