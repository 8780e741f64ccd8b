"""Shared machinery of the text readers: byte chunks of whole lines, re-batching, sharding, stats.

Every text reader works the same way (constant memory for any file size):

1. ``iter_line_chunks`` reads the file in ``chunk_bytes`` blocks, cuts each block after its last
   newline and carries the partial line over to the next block; a line longer than a block simply
   makes the next block bigger.
2. A Numba kernel (``_parse_kernels``, ``_criteo_kernels``) parses one chunk into arrays and hashes
   its features into keys: no Python loop over lines. With ``readers`` > 1 the chunks are parsed in
   that many threads and come back in order (``hps.data._parallel``).
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

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..errors import InvalidInputError
from ._batch import Batch, FixedBatch
from ._dense import SAMPLE_ROWS, check_transform, sample_stats
from ._dense import apply as dense_apply
from ._parallel import check_readers, ordered_map
from ._shards import Segment, check_shard, plan_segments, region_lines, seek_segment, share_bounds
from ._sources import compression, expand_paths, name_files, open_source

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
                     limit: int | None = None) -> Iterator[tuple[np.ndarray, int, int]]:
    """Blocks of whole lines of the binary file object ``f`` from its current position.

    Yields ``(buf, first_line, n_lines)``: buf (m,) uint8 host, read-only, every line ending in ``\\n``
    (one is added to an unterminated last line); ``first_line`` the 1-based line number of buf's first
    line; ``n_lines`` the lines in buf. With ``limit``, only the lines that start within the next
    ``limit`` bytes (the last one is read to its end, past the limit).
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
                yield np.frombuffer(carry, dtype=np.uint8), line, 1
            return
        data = f.read(chunk_bytes if left is None else min(chunk_bytes, left))
        if left is not None:
            left -= len(data)
        if not data:
            if carry:
                yield np.frombuffer(carry + b"\n", dtype=np.uint8), line, 1
            return
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf
            continue
        carry = buf[cut + 1:]
        n = buf.count(b"\n", 0, cut + 1)
        yield np.frombuffer(buf, dtype=np.uint8, count=cut + 1), line, n  # a view: no copy
        line += n


def cut_at_batches(part, first: int, batch_size: int) -> list:
    """``part`` (a FixedBatch or Batch: rows ``first`` … of a stream cut into batches of ``batch_size``)
    cut at the stream's batch boundaries; each whole batch already made a ``Batch`` — so a reader's
    threads, not the one :class:`Rebatcher`, build the batches that lie inside one work unit."""
    out, i, n = [], 0, len(part)
    while i < n:
        pos = first + i
        end = min(n, i + batch_size - pos % batch_size)
        piece = part.slice(i, end)
        if end - i == batch_size and isinstance(piece, FixedBatch):
            piece = piece.batch()
        out.append(piece)
        i = end
    return out


class Rebatcher:
    """Cuts a stream of parts (``Batch`` or ``FixedBatch``, all of one kind — but for whole batches
    made by :func:`cut_at_batches`) of any size into Batches of exactly ``batch_size`` examples
    (``flush``: the rest). Every example is copied at most once: a batch inside one part is a view of
    it."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self._parts: deque = deque()
        self._n = 0

    def push(self, part) -> Iterator[Batch]:
        """The batches ``part`` completes (a list: its pieces in order)."""
        if isinstance(part, list):
            for p in part:
                yield from self.push(p)
            return
        if len(part) == 0:
            return
        self._parts.append(part)
        self._n += len(part)
        while self._n >= self.batch_size:
            yield self._take(self.batch_size)

    def flush(self) -> Iterator[Batch]:
        if self._n:
            yield self._take(self._n)

    def _take(self, k: int) -> Batch:
        out, need = [], k
        while need:
            p = self._parts[0]
            if len(p) <= need:
                out.append(self._parts.popleft())
                need -= len(p)
            else:
                out.append(p.slice(0, need))
                self._parts[0] = p.slice(need, len(p))
                need = 0
        self._n -= k
        joined = type(out[0]).concat(out)
        return joined if isinstance(joined, Batch) else joined.batch()


@dataclass(frozen=True)
class _Chunk:
    """One work unit of a text reader: ``buf`` (m,) uint8 of ``n_lines`` whole lines, the first of
    them line ``first_line`` of ``path`` (as malformed-line reports name it)."""

    buf: np.ndarray
    n_lines: int
    path: str
    first_line: int


def check_common(batch_size: int, shard) -> tuple[int, int]:
    """Validates ``batch_size`` and ``shard=(index, n_shards)``; returns the shard as ints."""
    if int(batch_size) < 1:
        raise InvalidInputError(f"batch_size must be >= 1, got {batch_size}")
    return check_shard(shard)


class TextReader:
    """Base of the file readers. Subclasses set ``n_fields``, ``n_dense`` and ``format_description``
    and implement ``_parse``; ``_open`` may skip a header. (Parquet replaces the work units:
    ``_units``, ``_work``, ``_accept``.)

    ``batches(start_batch)`` yields this shard's batches start_batch, start_batch+1, … (earlier
    batches are parsed and dropped, so a resumed run sees exactly the same batches).

    ``readers`` threads parse the chunks of a pass (``hps.data._parallel``): the chunks are read in
    order by the iterating thread, parsed in parallel, and counted, checked and cut into batches in
    order — the same batches, counts and errors for any number of readers.

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
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, max_malformed: float = DEFAULT_MAX_MALFORMED,
                 readers: int = 1):
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
        self.readers = check_readers(readers)
        self.dense_transform, self.dense_stats = "none", None  # CSV / Parquet: _setup_dense
        self.probe_dense_max = 0.0
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
        sizes = [p.stat().st_size for p in self.paths]
        cut = [compression(p) is None for p in self.paths]
        # cut where the lines are (a file's lines may differ in length along it), plain files only
        lines = [region_lines(p, ds, sz) for p, ds, sz in zip(self.paths, starts, sizes)] if all(cut) else None
        return plan_segments(self.paths, starts, sizes, self.shard, self.n_shards, splittable=cut, lines=lines)

    def _whole(self, p: Path) -> Segment:
        ds = self._data_start(p)[0]
        return Segment(p, ds, p.stat().st_size if compression(p) is None else None, ds)

    def batches(self, start_batch: int = 0) -> Iterator[Batch]:
        """This shard's batches from ``start_batch`` on; resets ``stats``."""
        self.stats = ReaderStats()
        reb = Rebatcher(self.batch_size)
        gb = 0
        for _, part in self._pass(self.chunk_bytes):
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
            for _, part in self._pass(PROBE_BYTES, max_chunks=1, readers=1):
                for p in part if isinstance(part, list) else [part]:
                    if len(p) and p.dense.size:  # how large the dense values are (the trainer warns)
                        self.probe_dense_max = max(self.probe_dense_max, float(np.abs(p.dense).max()))
            st = self.stats
            all_bad = st.examples == 0 and st.malformed > self.max_malformed * (st.lines - st.blank)
            self._check(st, final=not self._cut or all_bad)
            return st
        finally:
            self.stats = saved

    def read_segments(self, segments: list[Segment]) -> Iterator[tuple[int, object]]:
        """``(i, part)`` of one pass over ``segments`` — this shard's own, or a finer cut of them
        (``hps.data._shards.split_segments``) — part (a Batch or FixedBatch of valid examples, or a
        list of them) coming from ``segments[i]``, in order; counted into ``stats`` (reset) and checked as a pass of
        :meth:`batches` is, the end-of-pass check included (``python -m hps.convert``)."""
        self.stats = ReaderStats()
        yield from self._pass(self.chunk_bytes, segments=segments)
        self._check(self.stats, final=True)

    def _pass(self, chunk_bytes: int, max_chunks: int | None = None, readers: int | None = None,
              segments: list[Segment] | None = None):
        """``(segment index, part)`` of a pass over ``segments`` (default: this shard's), in order,
        counted into ``stats`` and checked unit by unit; ``max_chunks``: per segment (a probe)."""
        segs = self.segments() if segments is None else segments
        self._pass_rows = 0  # rows of the pass before the next unit, where readers know them (_converted)
        units = ((i, u) for i, seg in enumerate(segs) for u in self._units(seg, chunk_bytes, max_chunks))
        for (i, unit), result in ordered_map(self._work_on, units, readers or self.readers):
            yield i, self._accept(unit, result)
            self._after(unit, result)

    def _work_on(self, item):
        return item, self._work(item[1])

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

    def _parse(self, buf: np.ndarray, n_lines: int, bad_line: np.ndarray, bad_code: np.ndarray):
        """Parse one chunk of ``n_lines`` lines -> ((n_lines, n_ok, n_bad, n_blank), the n_ok valid
        lines as a Batch or FixedBatch). Pure (no state of the reader changes): runs in the readers'
        threads."""
        raise NotImplementedError

    def _units(self, seg: Segment, chunk_bytes: int, max_chunks: int | None = None) -> Iterator[_Chunk]:
        """The chunks of lines of one segment, in order. Malformed lines are named by file:line, or
        — when the segment starts inside a file — by line counted from the segment's first byte."""
        if seg.stop is None:  # a compressed file: its whole stream, past what _open skips
            f, first = self._open(seg.path)
            with f:
                yield from self._chunks(f, seg.path, first, None, chunk_bytes, max_chunks)
            return
        with open(seg.path, "rb") as f:
            begin = seek_segment(f, seg)
            if begin >= seg.stop:
                return
            if begin == seg.data_start:
                path, first = seg.path, self._data_start(seg.path)[1]
            else:
                path, first = f"{seg.path} (lines counted from byte {begin})", 1
            yield from self._chunks(f, path, first, seg.stop - begin, chunk_bytes, max_chunks)

    def _chunks(self, f, path, first: int, limit, chunk_bytes: int, max_chunks) -> Iterator[_Chunk]:
        for k, (buf, first_line, n) in enumerate(iter_line_chunks(f, chunk_bytes, first, limit=limit)):
            if max_chunks is not None and k >= max_chunks:
                self._cut = True
                return
            yield _Chunk(buf, n, str(path), first_line)

    def _work(self, unit: _Chunk):
        bad_line = np.empty(MAX_RECORDED_MALFORMED, dtype=np.int64)
        bad_code = np.empty(MAX_RECORDED_MALFORMED, dtype=np.int32)
        counts, part = self._parse(unit.buf, unit.n_lines, bad_line, bad_code)
        return counts, bad_line, bad_code, self._transformed(part)

    def _transformed(self, part):
        """``part`` with its dense columns transformed (``hps.data._dense``). Thread-safe."""
        if self.dense_transform != "none":
            part.dense = dense_apply(part.dense, self.dense_transform, self.dense_stats)
        return part

    def _setup_dense(self, transform: str, stats, sample) -> None:
        """Sets the dense transform; ``standardize`` without ``stats`` takes them from ``sample()`` (the
        untransformed batches of the whole data, from its start)."""
        self.dense_stats = check_transform(transform, stats, self.n_dense)
        if transform == "standardize" and self.dense_stats is None:
            it = sample()
            try:
                self.dense_stats = sample_stats(it)
            finally:
                it.close()
        self.dense_transform = transform

    def _accept(self, unit: _Chunk, result):
        """Counts a parsed chunk into ``stats`` (in order) and returns its part."""
        (n_lines, n_ok, n_bad, n_blank), bad_line, bad_code, part = result
        st = self.stats
        st.lines += n_lines
        st.examples += n_ok
        st.blank += n_blank
        st.malformed += n_bad
        st.bytes += unit.buf.shape[0]
        for j in range(min(n_bad, bad_line.shape[0], MAX_RECORDED_MALFORMED - len(st.malformed_at))):
            st.malformed_at.append((unit.path, unit.first_line + int(bad_line[j]), REASONS[int(bad_code[j])]))
        return part

    def _after(self, unit: _Chunk, result) -> None:
        """What follows a chunk's part: the strict stop at its first malformed line, the checks."""
        (_, _, n_bad, _), bad_line, bad_code, _ = result
        if n_bad and self.strict:
            raise InvalidInputError(f"{unit.path}:{unit.first_line + int(bad_line[0])}: malformed line "
                                    f"({REASONS[int(bad_code[0])]}); expected {self.format_description}")
        self._check(self.stats, final=False)

    def _check(self, st: ReaderStats, final: bool) -> None:
        """Raises when ``st`` has too many malformed lines or (``final``) no example at all."""
        n = st.lines - st.blank
        files, want = name_files(self.paths), self.format_description
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
