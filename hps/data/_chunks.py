"""Shared machinery of the text readers: byte chunks of whole lines, re-batching, sharding, stats.

Every text reader works the same way (constant memory for any file size):

1. ``iter_line_chunks`` reads the file in ``chunk_bytes`` blocks, cuts each block after its last
   newline and carries the partial line over to the next block; a line longer than a block simply
   makes the next block bigger.
2. A Numba kernel (``_parse_kernels``) parses one chunk into arrays: no Python loop over lines.
3. ``Rebatcher`` cuts the parsed examples into batches of exactly ``batch_size`` (the last may be
   shorter).

Sharding (``shard=(s, K)``, ``hps.data._shards``): a reader parses only shard ``s`` of its files —
whole files when there are at least ``K``, else a byte range aligned to line starts — and its
batches are that shard's examples in file order. Line numbers in malformed-line reports count from
the start of the file when the shard starts there, else from the first line of the shard (the
report names the byte offset it starts at).

Not thread-safe: one ``batches()`` iteration per reader object at a time.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..errors import InvalidInputError
from ._batch import Batch, make_keys
from ._shards import Segment, check_shard, plan_segments, seek_segment, share_bounds

#: Default size of one read (bytes). 16 MiB keeps parsed arrays of one chunk around 30 MB.
DEFAULT_CHUNK_BYTES = 16 << 20
#: How many malformed lines are remembered (file, line number, reason) per pass.
MAX_RECORDED_MALFORMED = 10
#: Feature value used for a missing categorical (empty column). Hashed like any value, so every field
#: has its own "missing" key; above every 32-bit value, so it never collides with a Criteo hex value.
#: Written to disk inside keys: never change.
MISSING_VALUE = (1 << 32) + 1

# Reasons a line is malformed (codes written by the parse kernels).
BAD_COLUMNS = 1
BAD_LABEL = 2
BAD_NUMBER = 3
BAD_HEX = 4
BAD_FEATURE = 5
REASONS = {
    BAD_COLUMNS: "wrong number of columns",
    BAD_LABEL: "unparseable label",
    BAD_NUMBER: "unparseable or out-of-range number",
    BAD_HEX: "categorical is not 1-8 hex digits",
    BAD_FEATURE: "feature is not idx:value",
}


class DataFileNotFoundError(InvalidInputError, FileNotFoundError):
    """A data file does not exist (an ``InvalidInputError`` and a ``FileNotFoundError``)."""


@dataclass
class ReaderStats:
    """Counters of the current (or last) pass of a reader over its files.

    ``lines`` counts every data line read (blank ones included, CSV headers excluded); ``examples``
    the valid ones; ``malformed`` the skipped ones, the first ``MAX_RECORDED_MALFORMED`` of which are
    in ``malformed_at`` as ``(file, line_number, reason)`` (line numbers 1-based, header counted).
    """

    lines: int = 0
    examples: int = 0
    blank: int = 0
    malformed: int = 0
    malformed_at: list = field(default_factory=list)
    bytes: int = 0


def as_paths(path) -> list[Path]:
    """Data files -> list of existing files, in order. ``path``: a file, a directory (its regular files
    not starting with ``.``, sorted by name), a glob pattern (``*``, ``?``, ``[``; sorted matches), or a
    sequence of files. A missing file or a pattern matching nothing raises."""
    if isinstance(path, (str, os.PathLike)):
        text = os.fspath(path)
        if Path(text).is_dir():
            paths = sorted(p for p in Path(text).iterdir() if p.is_file() and not p.name.startswith("."))
            if not paths:
                raise DataFileNotFoundError(f"data directory {text} holds no data file")
        elif any(c in text for c in "*?[") and not Path(text).exists():
            paths = [Path(x) for x in sorted(glob.glob(text)) if Path(x).is_file()]
            if not paths:
                raise DataFileNotFoundError(f"no data file matches {text}")
        else:
            paths = [text]
    else:
        paths = list(path)
    if not paths:
        raise InvalidInputError("no data file given")
    out = []
    for p in paths:
        p = Path(p)
        if not p.is_file():
            raise DataFileNotFoundError(f"data file not found: {p}")
        out.append(p)
    return out


def iter_line_chunks(f, chunk_bytes: int, first_line: int = 1,
                     limit: int | None = None) -> Iterator[tuple[np.ndarray, int]]:
    """Blocks of whole lines of the binary file object ``f`` from its current position.

    Yields ``(buf, first_line)``: buf (m,) uint8 host, every line ending in ``\\n`` (one is added to an
    unterminated last line); ``first_line`` the 1-based line number of buf's first line. With
    ``limit``, only the lines that start within the next ``limit`` bytes (the last one is read to its
    end, past the limit).
    """
    carry = b""
    line = first_line
    left = limit
    while True:
        if left is not None and left <= 0:
            if carry:  # the line crossing the limit: read on to its newline
                while True:
                    data = f.read(chunk_bytes)
                    cut = data.find(b"\n")
                    if cut >= 0 or not data:
                        carry += data[:cut + 1] if cut >= 0 else data + b"\n"
                        break
                    carry += data
                yield np.frombuffer(carry, dtype=np.uint8), line
            return
        data = f.read(chunk_bytes if left is None else min(chunk_bytes, left))
        if left is not None:
            left -= len(data)
        if not data:
            if carry:
                yield np.frombuffer(carry + b"\n", dtype=np.uint8), line
            return
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
            continue
        chunk = buf[:cut + 1]
        carry = buf[cut + 1:]
        yield np.frombuffer(chunk, dtype=np.uint8), line
        line += chunk.count(b"\n")


def fixed_width_batch(labels: np.ndarray, dense: np.ndarray, values: np.ndarray) -> Batch:
    """Batch of examples that all have one key per field. values (n, F) uint64 feature values."""
    n, n_fields = values.shape
    field_ids = np.tile(np.arange(n_fields, dtype=np.int32), n)
    keys = make_keys(field_ids, values.reshape(-1))
    return Batch(labels, dense, keys, field_ids, np.ones(n * n_fields, dtype=np.float32),
                 np.arange(0, (n + 1) * n_fields, n_fields, dtype=np.int64), n_fields)


class Rebatcher:
    """Cuts a stream of Batches of any size into Batches of exactly ``batch_size`` examples."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self._parts: list[Batch] = []
        self._n = 0

    def push(self, part: Batch) -> Iterator[Batch]:
        if len(part) == 0:
            return
        self._parts.append(part)
        self._n += len(part)
        if self._n < self.batch_size:
            return
        big = Batch.concat(self._parts)
        bs, i = self.batch_size, 0
        while self._n - i >= bs:
            yield big.slice(i, i + bs)
            i += bs
        self._parts = [big.slice(i, self._n)] if i < self._n else []
        self._n -= i

    def flush(self) -> Iterator[Batch]:
        if self._n:
            yield Batch.concat(self._parts)
        self._parts, self._n = [], 0


def check_common(batch_size: int, shard) -> tuple[int, int]:
    """Validates ``batch_size`` and ``shard=(index, n_shards)``; returns the shard as ints."""
    if int(batch_size) < 1:
        raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
    return check_shard(shard)


class TextReader:
    """Base of the text readers. Subclasses set ``n_fields``/``n_dense`` and implement ``_parts``.

    ``batches(start_batch)`` yields this shard's batches start_batch, start_batch+1, … (earlier
    batches are parsed and dropped, so a resumed run sees exactly the same batches).
    """

    n_fields: int
    n_dense: int
    #: Number of the first data line of a file (2 when a header line comes first).
    first_data_line = 1

    def __init__(self, path, batch_size: int, shard=(0, 1), strict: bool = False,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES):
        self.paths: Sequence[Path] = as_paths(path)
        self.batch_size = int(batch_size)
        self.shard, self.n_shards = check_common(batch_size, shard)
        if int(chunk_bytes) < 1:
            raise InvalidInputError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        self.strict = bool(strict)
        self.chunk_bytes = int(chunk_bytes)
        self.stats = ReaderStats()

    def _data_start(self, path: Path) -> int:
        """Byte offset where the data lines of ``path`` begin (after a header, if the format has one)."""
        return 0

    def segments(self) -> list[Segment]:
        """The byte ranges this shard reads (``hps.data._shards``)."""
        if len(self.paths) >= self.n_shards:  # whole files: only our own files are looked at
            own = [self.paths[i] for i in range(*share_bounds(len(self.paths), self.shard, self.n_shards))]
            return [Segment(p, self._data_start(p), p.stat().st_size, self._data_start(p)) for p in own]
        return plan_segments(self.paths, [self._data_start(p) for p in self.paths],
                             [p.stat().st_size for p in self.paths], self.shard, self.n_shards)

    def batches(self, start_batch: int = 0) -> Iterator[Batch]:
        """This shard's batches from ``start_batch`` on; resets ``stats``."""
        self.stats = ReaderStats()
        reb = Rebatcher(self.batch_size)
        gb = 0
        for seg in self.segments():
            for part in self._parts(seg):
                for b in reb.push(part):
                    if gb >= start_batch:
                        yield b
                    gb += 1
        for b in reb.flush():
            if gb >= start_batch:
                yield b
            gb += 1

    def _line_chunks(self, f, seg: Segment) -> Iterator[tuple[np.ndarray, int, str]]:
        """``(buf, first_line, where)`` blocks of the lines of ``seg`` in the open file ``f``; ``where``
        names the file (and, when the segment starts inside it, the byte its line numbers count from)."""
        begin = seek_segment(f, seg)
        if begin >= seg.stop:
            return
        if begin == seg.data_start:
            where, first = str(seg.path), self.first_data_line
        else:
            where, first = f"{seg.path} (lines counted from byte {begin})", 1
        for buf, line in iter_line_chunks(f, self.chunk_bytes, first, limit=seg.stop - begin):
            yield buf, line, where

    def _parts(self, seg: Segment) -> Iterator[Batch]:
        raise NotImplementedError

    def _account(self, path, buf: np.ndarray, first_line: int, n_lines: int, n_ok: int,
                 n_bad: int, n_blank: int, bad_line: np.ndarray, bad_code: np.ndarray) -> None:
        """Adds one parsed chunk to ``stats``; in strict mode raises at its first malformed line."""
        st = self.stats
        st.lines += n_lines
        st.examples += n_ok
        st.blank += n_blank
        st.malformed += n_bad
        st.bytes += buf.shape[0]
        for k in range(min(n_bad, bad_line.shape[0])):
            if len(st.malformed_at) >= MAX_RECORDED_MALFORMED:
                break
            st.malformed_at.append((str(path), first_line + int(bad_line[k]),
                                    REASONS[int(bad_code[k])]))

    def _raise_first_bad(self, path, first_line: int, bad_line, bad_code) -> None:
        raise InvalidInputError(f"{path}:{first_line + int(bad_line[0])}: malformed line "
                                f"({REASONS[int(bad_code[0])]})")
