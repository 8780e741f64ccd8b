"""``convert``: read any input hps reads and write it as pre-hashed Parquet (``hps.data._converted``).

The source is read once, in order, with its own reader (parse, hash: the very keys training would
make), cut into *pieces*: its segments split at every boundary of the shards of ``--data-shards K``
for K = 2 … ``max_shards`` (``hps.data._shards.split_segments``). A piece belongs to one shard of
every K, so the rows at which each shard begins are known (the manifest's ``shards``) and row groups
are cut there: reading the converted data with K shards gives each shard exactly the source shard's
rows. Synthetic data is cut by rows (``share_bounds``), as its reader cuts it.

Atomic: everything is written into a hidden sibling directory, fsynced, and renamed into ``out`` at
the end (an earlier conversion there is swapped out and its files removed; those are all files hps
wrote). A non-empty ``out`` that is not a conversion, or one that holds other files besides, is
refused before anything is read. A failed or interrupted conversion removes its temporary directory
and leaves ``out`` as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..data import HASHING_VERSION, FixedBatch, is_converted, open_dataset, share_bounds
from ..data._converted import (COMPRESSIONS, DEFAULT_MAX_SHARDS, LAYOUT_VERSION, MANIFEST, META_KEY, ROW_GROUP_ROWS,
                              read_manifest)
from ..data._shards import split_segments
from ..errors import InvalidInputError
from ..formats import fsync_path

#: Rows of a file when ``rows_per_file`` is not given (about 1.1 GB at 26 fields and 13 dense).
DEFAULT_ROWS_PER_FILE = 1 << 22


def check_out(out: Path) -> dict | None:
    """The manifest of an earlier conversion in ``out`` (None: ``out`` is missing or empty). Raises
    InvalidInputError when ``out`` is a file, or a non-empty directory that is not a conversion or
    holds files the conversion did not write."""
    if not out.exists():
        return None
    if not out.is_dir():
        raise InvalidInputError(f"--out {out} is a file, not a directory")
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return None
    man = read_manifest(out)
    if man is None:
        raise InvalidInputError(f"--out {out} is not empty and holds no earlier conversion ({len(present)} "
                                "entries): hps writes only into an empty directory or over its own conversion")
    ours = {MANIFEST, *(f["name"] for f in man["files"])}
    extra = [n for n in present if n not in ours]
    if extra:
        raise InvalidInputError(f"--out {out} holds an earlier conversion and also {extra[0]!r}, which it did "
                                "not write: move that away first (hps deletes only the files it made)")
    return man


def shard_plan(open_shard, max_shards: int):
    """(pieces, owners): the segments of the whole data cut at every shard boundary for K = 2 …
    ``max_shards``, and ``owners[K][i]`` the shard of K that holds piece i. ``open_shard((s, K))``
    opens the source's reader of that shard (nothing is parsed)."""
    full = open_shard((0, 1)).segments()
    per_k = {k: [open_shard((s, k)).segments() for s in range(k)] for k in range(2, max_shards + 1)}
    cuts: dict = defaultdict(set)
    for shards in per_k.values():
        for segs in shards:
            for seg in segs:
                cuts[seg.path].add(seg.start)
                if seg.stop is not None:
                    cuts[seg.path].add(seg.stop)
    pieces = split_segments(full, cuts)
    owners = {1: [0] * len(pieces)}
    for k, shards in per_k.items():
        owners[k] = [next(s for s, segs in enumerate(shards) if any(_inside(p, g) for g in segs)) for p in pieces]
    return pieces, owners


def _inside(piece, seg) -> bool:
    if piece.path != seg.path:
        return False
    if seg.stop is None or piece.stop is None:
        return seg.stop is None and piece.stop is None
    return seg.start <= piece.start and piece.stop <= seg.stop


class _Writer:
    """Writes row groups of at most ``group_rows`` rows into files of ``rows_per_file`` rows (a file
    ends at a row group's end), each file's footer carrying ``meta`` with its index."""

    def __init__(self, tmp: Path, schema, meta: dict, rows_per_file: int, compression: str):
        self.tmp, self.schema, self.meta = tmp, schema, meta
        self.rows_per_file = rows_per_file
        self.group_rows = min(ROW_GROUP_ROWS, rows_per_file)
        self.compression = compression
        self.files: list[dict] = []
        self._pq = None
        self._file_rows = 0
        self._parts: list = []
        self._n = 0
        self.rows = 0

    def add(self, part) -> None:
        while len(part):
            room = self._room()
            take = part.slice(0, min(room, len(part)))
            self._parts.append(take)
            self._n += len(take)
            part = part.slice(len(take), len(part))
            if self._n >= room:
                self.cut()

    def _room(self) -> int:
        return min(self.group_rows - self._n, self.rows_per_file - self._file_rows - self._n)

    def cut(self) -> None:
        """End the current row group (a shard boundary, or full)."""
        if not self._n:
            return
        import pyarrow.parquet as pq

        part = type(self._parts[0]).concat(self._parts)
        if self._pq is None:
            name = f"part-{len(self.files):05d}.parquet"
            meta = dict(self.meta, file=len(self.files))
            schema = self.schema.with_metadata({META_KEY: json.dumps(meta).encode()})
            self._pq = pq.ParquetWriter(self.tmp / name, schema, compression=self.compression,
                                        use_dictionary=False, write_page_checksum=True, write_statistics=False)
            self.files.append({"name": name, "rows": 0})
        self._pq.write_table(_table(part, self.schema), row_group_size=self._n)
        self.files[-1]["rows"] += self._n
        self.rows += self._n
        self._file_rows += self._n
        self._parts, self._n = [], 0
        if self._file_rows >= self.rows_per_file:
            self.close_file()

    def close_file(self) -> None:
        if self._pq is not None:
            self._pq.close()
            self._pq = None
            self._file_rows = 0

    def finish(self) -> None:
        self.cut()
        self.close_file()
        for f in self.files:
            path = self.tmp / f["name"]
            f["bytes"] = path.stat().st_size
            fsync_path(path)


def schema_of(n_dense: int, n_fields: int, fixed_width: bool):
    """The Arrow schema of the layout (``hps.data._converted``); every column required."""
    import pyarrow as pa

    cols = [pa.field("label", pa.float32(), nullable=False)]
    if n_dense:
        cols.append(pa.field("dense", pa.list_(pa.field("item", pa.float32(), nullable=False), n_dense),
                             nullable=False))
    if fixed_width:
        cols.append(pa.field("keys", pa.list_(pa.field("item", pa.uint64(), nullable=False), n_fields),
                             nullable=False))
    else:
        cols.append(pa.field("keys", pa.list_(pa.field("item", pa.uint64(), nullable=False)), nullable=False))
        cols.append(pa.field("weights", pa.list_(pa.field("item", pa.float32(), nullable=False)), nullable=False))
    return pa.schema(cols)


def _table(part, schema):
    """A FixedBatch or Batch as an Arrow table of ``schema`` (zero-copy from the NumPy arrays)."""
    import pyarrow as pa

    arrays = [pa.array(np.ascontiguousarray(part.labels, np.float32))]
    if "dense" in schema.names:
        arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(part.dense).reshape(-1)),
                                                        type=schema.field("dense").type))
    if isinstance(part, FixedBatch):
        arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(part.keys).reshape(-1)),
                                                        type=schema.field("keys").type))
    else:
        offsets = pa.array(part.offsets.astype(np.int32))
        arrays.append(pa.ListArray.from_arrays(offsets, pa.array(part.keys), type=schema.field("keys").type))
        arrays.append(pa.ListArray.from_arrays(offsets, pa.array(part.weights), type=schema.field("weights").type))
    return pa.Table.from_arrays(arrays, schema=schema)


def source_record(fmt: str, reader, options: dict) -> dict:
    """What the converted keys are: the source's format and its reader options, resolved (CSV/Parquet
    columns by name, libsvm's field count)."""
    opts = {k: v for k, v in options.items()}
    if fmt in ("csv", "parquet"):
        opts.update(categorical_columns=list(reader.categorical_columns), dense_columns=list(reader.dense_columns),
                    ignore_columns=[], label=reader.label, dense_transform=reader.dense_transform,
                    dense_stats=reader.dense_stats)
    if fmt == "libsvm":
        opts["n_fields"] = reader.n_fields
    return {"format": fmt, "options": json.loads(json.dumps(opts, default=list))}


def convert(fmt: str, data, out, options: dict | None = None, *, rows_per_file: int | None = None,
            max_shards: int = DEFAULT_MAX_SHARDS, readers: int = 1, strict: bool = False,
            max_malformed: float | None = None, compression: str = "none", batch_size: int = 65_536,
            progress=None) -> dict:
    """Convert ``data`` of ``fmt`` (with the reader ``options`` of ``open_dataset``) into the directory
    ``out`` (see the module docstring); ``rows_per_file``: rows per file (None:
    ``DEFAULT_ROWS_PER_FILE``); ``progress``: a callable taking rows written so far (or None).
    Returns the manifest. Raises InvalidInputError (bad ``out``, bad data) before ``out`` changes."""
    out = Path(out).resolve()   # "." too: the conversion is assembled beside out, in its parent
    if not out.parent.is_dir():
        raise InvalidInputError(f"--out {out}: its directory {out.parent} does not exist; create it first")
    options = dict(options or {})
    rows_per_file = DEFAULT_ROWS_PER_FILE if rows_per_file is None else rows_per_file
    if int(rows_per_file) < 1:
        raise InvalidInputError(f"--rows-per-file must be >= 1, got {rows_per_file}")
    if not 1 <= int(max_shards) <= 64:
        raise InvalidInputError(f"--max-data-shards must lie in [1, 64], got {max_shards}")
    if compression not in COMPRESSIONS:
        raise InvalidInputError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
    if fmt == "parquet" and data is not None and is_converted(data):
        raise InvalidInputError(f"{data} is converted data already: train from it (--format parquet --data {data})")
    old = check_out(out)
    read = {"strict": strict, "readers": readers}
    if max_malformed is not None:
        read["max_malformed"] = max_malformed
    if fmt == "synthetic":
        read = {"readers": readers}

    def open_shard(shard):
        return open_dataset(data, fmt, batch_size, shard=shard, **read, **options)

    reader = open_shard((0, 1))
    reader.probe()
    fixed = fmt != "libsvm"
    conversion = uuid.uuid4().hex
    meta = {"layout": LAYOUT_VERSION, "hashing": HASHING_VERSION, "conversion": conversion,
            "n_fields": reader.n_fields, "n_dense": reader.n_dense, "fixed_width": fixed,
            "source": source_record(fmt, reader, options)}
    tmp = out.parent / f".{out.name}.hps-convert-{conversion[:12]}"
    tmp.mkdir(parents=False)
    try:
        writer = _Writer(tmp, schema_of(reader.n_dense, reader.n_fields, fixed), meta, rows_per_file, compression)
        shards = _write_all(fmt, reader, open_shard, writer, max_shards, progress)
        writer.finish()
        manifest = dict(meta, files=writer.files, rows=writer.rows, shards={str(k): v for k, v in shards.items()},
                        malformed=reader.stats.malformed, max_shards=max_shards)
        _write_json(tmp / MANIFEST, manifest)
        fsync_path(tmp, directory=True)
        _swap_in(tmp, out, old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # our own directory: only files this call wrote
        raise
    return manifest


def _write_all(fmt, reader, open_shard, writer: _Writer, max_shards: int, progress) -> dict:
    """Reads the source in order into ``writer``; returns ``{K: [first row of each shard] + [rows]}``."""
    if fmt == "synthetic":
        rows = reader.stream_rows
        shards = {k: [share_bounds(rows, s, k)[0] for s in range(k)] + [rows] for k in range(1, max_shards + 1)}
        cuts = sorted({c for v in shards.values() for c in v[1:-1]})
        for b in reader.batches():
            part = _fixed(b)
            while len(part):
                nxt = next((c for c in cuts if c > writer.rows + writer._n), None)
                take = len(part) if nxt is None else min(len(part), nxt - writer.rows - writer._n)
                writer.add(part.slice(0, take))
                part = part.slice(take, len(part))
                if nxt is not None and writer.rows + writer._n == nxt:
                    writer.cut()
            if progress:
                progress(writer.rows + writer._n)
        return shards
    pieces, owners = shard_plan(open_shard, max_shards)
    starts = [0] * (len(pieces) + 1)  # rows before each piece
    current = 0
    for i, part in reader.read_segments(pieces):
        while current < i:  # pieces current .. i - 1 are done
            current += 1
            starts[current] = writer.rows + writer._n
            if any(owners[k][current - 1] != owners[k][current] for k in owners):
                writer.cut()  # a shard boundary: whole row groups per shard
        for p in part if isinstance(part, list) else [part]:
            writer.add(p if fmt == "libsvm" else _fixed(p))
        if progress:
            progress(writer.rows + writer._n)
    for j in range(current + 1, len(pieces) + 1):
        starts[j] = writer.rows + writer._n
    shards = {}
    for k, own in owners.items():
        firsts = [next((starts[i] for i, o in enumerate(own) if o >= s), starts[-1]) for s in range(k)]
        shards[k] = firsts + [starts[-1]]
    return shards


def _fixed(part):
    """A reader's part as a FixedBatch (Batches of fixed-width data: one key per field, weight 1)."""
    if isinstance(part, FixedBatch):
        return part
    return FixedBatch(part.labels, part.dense, part.keys.reshape(len(part), part.n_fields))


def _write_json(path: Path, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _swap_in(tmp: Path, out: Path, old: dict | None) -> None:
    """Rename the finished conversion ``tmp`` to ``out``; an earlier conversion there is moved aside
    first and its files (the ones its manifest lists, all written by hps) removed after."""
    if old is None:
        if out.exists():
            out.rmdir()  # empty (check_out)
        os.rename(tmp, out)
    else:
        aside = out.parent / f".{out.name}.hps-old-{old.get('conversion', 'x')[:12]}"
        os.rename(out, aside)
        os.rename(tmp, out)
        for f in old["files"]:
            (aside / f["name"]).unlink(missing_ok=True)
        (aside / MANIFEST).unlink(missing_ok=True)
        aside.rmdir()
    fsync_path(out.parent, directory=True)
