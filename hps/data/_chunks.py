"""Shared machinery of the text readers: byte chunks of whole lines, re-batching, sharding, stats.

Every text reader works the same way (constant memory for any file size):

1. ``iter_line_chunks`` reads the file in ``chunk_bytes`` blocks, cuts each block after its last
   newline and carries the partial line over to the next block; a line longer than a block simply
   makes the next block bigger.
2. A Numba kernel (``_parse_kernels``) parses one chunk into arrays: no Python loop over lines.
3. ``Rebatcher`` cuts the parsed examples into batches of exactly ``batch_size`` (the last may be
   shorter).

Sharding (``shard=(s, K)``, ``hps.data._shards``): a reader parses only shard ``s`` of its files —
whole files when there are at least ``K``, else a byte range aligned to line starts (a compressed
file, ``hps.data._sources``, is never cut: it is read whole) — and its batches are that shard's
examples in file order. Line numbers in malformed-line reports count from
the start of the file when the shard starts there, else from the first line of the shard (the
report names the byte offset it starts at).

Not thread-safe: one ``batches()`` iteration per reader object at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..errors import InvalidInputError
from ._batch import Batch, make_keys
from ._shards import Segment, check_shard, plan_segments, seek_segment, share_bounds
from ._sources import compression, expand_paths, open_source

#: Default size of one read (bytes). 16 MiB keeps parsed arrays of one chunk around 30 MB.
DEFAULT_CHUNK_BYTES = 16 << 20
#: How many malformed lines are remembered (file, line number, reason) per pass.
MAX_RECORDED_MALFORMED = 10
#: Default largest fraction of malformed (non-blank) lines a pass may skip before it stops.
DEFAULT_MAX_MALFORMED = 0.01
#: Lines a pass reads before the malformed fraction is checked mid-pass (it is always checked at the
#: end of the pass), so a few bad lines early in a file do not stop it.
MIN_LINES_FOR_FRACTION = 10_000
#: Bytes of each file that ``TextReader.probe`` parses before a job starts.
PROBE_BYTES = 1 << 20
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

    def first_malformed(self) -> list[str]:
        """The recorded malformed lines as ``"file:line: reason"``."""
        return [f"{f}:{ln}: {why}" for f, ln, why in self.malformed_at]


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
    """Base of the text readers. Subclasses set ``n_fields``, ``n_dense`` and ``format_description``
    and implement ``_parse``; ``_open`` may skip a header.

    ``batches(start_batch)`` yields this shard's batches start_batch, start_batch+1, … (earlier
    batches are parsed and dropped, so a resumed run sees exactly the same batches).

    Malformed lines are counted (in the parse kernels) and skipped. A pass raises
    ``InvalidInputError`` naming the first of them by file:line and the expected format when:
    ``strict`` and a line is malformed (at that line); more than ``max_malformed`` (a fraction of
    the non-blank lines) are malformed (checked after every chunk once ``MIN_LINES_FOR_FRACTION``
    lines were read, and at the end of the pass); the pass found no valid example at all — except
    that a shard of several with no data line is not an error (its rank contributes empty batches;
    the trainer checks that the data as a whole holds examples).
    """

    n_fields: int
    n_dense: int
    #: What a valid line looks like (error messages name it).
    format_description: str = ""

    def __init__(self, path, batch_size: int, shard=(0, 1), strict: bool = False,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_malformed: float = DEFAULT_MAX_MALFORMED):
        self.paths: Sequence[Path] = expand_paths(path)
        self.batch_size = int(batch_size)
        self.shard, self.n_shards = check_common(batch_size, shard)
        if int(chunk_bytes) < 1:
            raise InvalidInputError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
        if not 0.0 <= float(max_malformed) <= 1.0:
            raise InvalidInputError(f"max_malformed must be a fraction in [0, 1], got {max_malformed}")
        self.strict = bool(strict)
        self.chunk_bytes = int(chunk_bytes)
        self.max_malformed = float(max_malformed)
        self.stats = ReaderStats()
        self._starts: dict = {}
        self._cut = False

    def segments(self) -> list[Segment]:
        """The byte ranges this shard reads (``hps.data._shards``); a compressed file is one
        whole-stream segment (``stop`` None)."""
        if len(self.paths) >= self.n_shards:  # whole files: only our own files are looked at
            own = [self.paths[i] for i in range(*share_bounds(len(self.paths), self.shard, self.n_shards))]
            return [self._whole(p) for p in own]
        starts = [self._data_start(p)[0] for p in self.paths]
        return plan_segments(self.paths, starts, [p.stat().st_size for p in self.paths], self.shard,
                             self.n_shards, splittable=[compression(p) is None for p in self.paths])

    def _whole(self, p: Path) -> Segment:
        ds = self._data_start(p)[0]
        return Segment(p, ds, p.stat().st_size if compression(p) is None else None, ds)

    def batches(self, start_batch: int = 0) -> Iterator[Batch]:
        """This shard's batches from ``start_batch`` on; resets ``stats``."""
        self.stats = ReaderStats()
        reb = Rebatcher(self.batch_size)
        gb = 0
        for seg in self.segments():
            for part in self._parts(seg, self.chunk_bytes):
                for b in reb.push(part):
                    if gb >= start_batch:
                        yield b
                    gb += 1
        self._check(self.stats, final=True)
        for b in reb.flush():
            if gb >= start_batch:
                yield b
            gb += 1

    def probe(self) -> ReaderStats:
        """Parses the first ``PROBE_BYTES`` of every segment of this shard and raises (as a pass
        would) when that already shows the data is unusable: no valid example among lines that are
        all malformed (a wrong format or label column), or with ``strict`` a malformed line. A shard
        read to its end gets the whole end-of-pass check. Returns the probe's counters; ``stats`` is
        left alone."""
        saved, self.stats = self.stats, ReaderStats()
        self._cut = False
        try:
            for seg in self.segments():
                for _ in self._parts(seg, PROBE_BYTES, max_chunks=1):
                    pass
            st = self.stats
            all_bad = st.examples == 0 and st.malformed > self.max_malformed * (st.lines - st.blank)
            self._check(st, final=not self._cut or all_bad)
            return st
        finally:
            self.stats = saved

    def _open(self, path: Path):
        """(binary stream positioned at the first data line, its 1-based line number); compressed
        files are decompressed (``hps.data._sources.open_source``)."""
        return open_source(path), 1

    def _data_start(self, path: Path) -> tuple[int, int]:
        """(byte offset, 1-based line number) of the first data line of ``path`` (after what
        ``_open`` skips: a header). A compressed file is never cut into byte ranges: offset 0."""
        if path not in self._starts:
            f, first = self._open(path)
            with f:
                self._starts[path] = (0 if compression(path) else f.tell(), first)
        return self._starts[path]

    def _parse(self, buf: np.ndarray, bad_line: np.ndarray, bad_code: np.ndarray):
        """Parse one chunk -> ((n_lines, n_ok, n_bad, n_blank), Batch of the n_ok valid lines)."""
        raise NotImplementedError

    def _parts(self, seg: Segment, chunk_bytes: int, max_chunks: int | None = None) -> Iterator[Batch]:
        """Parsed chunks of the lines of one segment, counted into ``stats`` (and checked) one by
        one. Malformed lines are named by file:line, or — when the segment starts inside a file —
        by line counted from the segment's first byte."""
        if seg.stop is None:  # a compressed file: its whole stream, past what _open skips
            f, first = self._open(seg.path)
            with f:
                yield from self._stream_parts(f, seg.path, first, None, chunk_bytes, max_chunks)
            return
        with open(seg.path, "rb") as f:
            begin = seek_segment(f, seg)
            if begin >= seg.stop:
                return
            if begin == seg.data_start:
                path, first = seg.path, self._data_start(seg.path)[1]
            else:
                path, first = f"{seg.path} (lines counted from byte {begin})", 1
            yield from self._stream_parts(f, path, first, seg.stop - begin, chunk_bytes, max_chunks)

    def _stream_parts(self, f, path, first: int, limit, chunk_bytes: int, max_chunks) -> Iterator[Batch]:
        """Parsed chunks of the lines of ``f`` from its position (``limit``: see ``iter_line_chunks``);
        ``path`` and ``first`` (the line number there) name malformed lines."""
        bad_line = np.empty(MAX_RECORDED_MALFORMED, dtype=np.int64)
        bad_code = np.empty(MAX_RECORDED_MALFORMED, dtype=np.int32)
        for k, (buf, first_line) in enumerate(iter_line_chunks(f, chunk_bytes, first, limit=limit)):
            if max_chunks is not None and k >= max_chunks:
                self._cut = True
                return
            (n_lines, n_ok, n_bad, n_blank), part = self._parse(buf, bad_line, bad_code)
            st = self.stats
            st.lines += n_lines
            st.examples += n_ok
            st.blank += n_blank
            st.malformed += n_bad
            st.bytes += buf.shape[0]
            for j in range(min(n_bad, bad_line.shape[0],
                               MAX_RECORDED_MALFORMED - len(st.malformed_at))):
                st.malformed_at.append((str(path), first_line + int(bad_line[j]),
                                        REASONS[int(bad_code[j])]))
            yield part
            if n_bad and self.strict:
                raise InvalidInputError(f"{path}:{first_line + int(bad_line[0])}: malformed line "
                                        f"({REASONS[int(bad_code[0])]}); expected "
                                        f"{self.format_description}")
            self._check(st, final=False)

    def _check(self, st: ReaderStats, final: bool) -> None:
        """Raises when ``st`` has too many malformed lines or (``final``) no example at all."""
        n = st.lines - st.blank
        files, want = ", ".join(map(str, self.paths)), self.format_description
        if self.n_shards > 1:
            files += f" (shard {self.shard} of {self.n_shards})"
        first = f" (first: {'; '.join(st.first_malformed()[:3])})" if st.malformed else ""
        if final and n == 0 and self.n_shards > 1:
            return  # an empty shard: its rank contributes empty batches
        if final and st.examples == 0:
            what = f"all {n} lines are malformed{first}" if n else "no data lines"
            raise InvalidInputError(f"no valid example in {files}: {what}; expected {want}")
        if (final or n >= MIN_LINES_FOR_FRACTION) and st.malformed > self.max_malformed * n:
            raise InvalidInputError(
                f"{st.malformed} of {'the' if final else 'the first'} {n} lines of {files} are "
                f"malformed ({st.malformed / n:.2%}, more than max_malformed {self.max_malformed:.2%} "
                f"allows){first}; expected {want}; fix the data or raise --max-malformed")
