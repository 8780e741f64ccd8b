"""Shards of the data: which bytes (or rows) shard ``s`` of ``K`` reads, so no reader parses another's.

Text files are cut into *segments*, nominal byte ranges ``[start, stop)`` of one file. A reader of a
segment reads exactly the lines that **start** inside it: it skips the partial line at ``start``
(unless ``start`` is where the file's data begins) and finishes the line that runs past ``stop``.
Every line therefore belongs to exactly one shard, and the shards of a file, read one after the other,
give its lines in order.

- At least ``K`` files: shard ``s`` reads whole files, the contiguous run
  ``files[share_bounds(F, s, K)]`` (in the order given).
- Fewer files than shards: the files' data regions (after a CSV header) are laid end to end and cut
  into ``K`` byte ranges of equal length; a range may span the end of one file and the start of the
  next (two segments). A file that cannot be cut (a compressed one, ``splittable`` False) is read
  whole by the shard whose byte range holds its first byte (its length is its compressed size).

Rows (synthetic data) are cut with :func:`share_bounds` as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidInputError

#: Bytes read per step while looking for the newline that ends a partial line.
SCAN_BYTES = 1 << 16


def share_bounds(n: int, s: int, k: int) -> tuple[int, int]:
    """``[start, stop)`` of share ``s`` when ``n`` items are cut into ``k`` contiguous shares (the
    first ``n % k`` shares are one longer)."""
    q, r = divmod(int(n), int(k))
    start = s * q + min(s, r)
    return start, start + q + (1 if s < r else 0)


def check_shard(shard) -> tuple[int, int]:
    """``shard=(s, K)`` as ints, validated (``0 <= s < K``)."""
    try:
        s, k = (int(x) for x in shard)
    except (TypeError, ValueError):
        raise InvalidInputError(f"shard must be (index, n_shards), got {shard!r}") from None
    if k < 1 or not 0 <= s < k:
        raise InvalidInputError(f"shard must satisfy 0 <= index < n_shards, got {shard!r}")
    return s, k


@dataclass(frozen=True)
class Segment:
    """Lines of ``path`` that start in ``[start, stop)``; the file's data begins at ``data_start``.
    ``stop`` None: the whole file, read as a stream from its start (a compressed file)."""

    path: Path
    start: int
    stop: int | None
    data_start: int = 0


def plan_segments(paths, data_starts, sizes, shard: int, n_shards: int, splittable=None) -> list[Segment]:
    """Segments of shard ``shard`` of ``n_shards`` over ``paths`` (file sizes ``sizes`` in bytes, data
    beginning at ``data_starts``; ``splittable`` (one bool per file, default all True): whether a
    file may be cut into byte ranges); see the module docstring. Pure: reads nothing."""
    paths, n = list(paths), len(paths)
    cut = list(splittable) if splittable is not None else [True] * n
    if n >= n_shards:
        a, b = share_bounds(n, shard, n_shards)
        return [Segment(paths[i], data_starts[i], sizes[i] if cut[i] else None, data_starts[i])
                for i in range(a, b)]
    lengths = [max(0, sz - ds) for sz, ds in zip(sizes, data_starts)]
    total = sum(lengths)
    lo, hi = shard * total // n_shards, (shard + 1) * total // n_shards
    out, base = [], 0
    for p, ds, length, c in zip(paths, data_starts, lengths, cut):
        if not c:
            if length and lo <= base < hi:
                out.append(Segment(p, ds, None, ds))
        else:
            a, b = max(lo, base), min(hi, base + length)
            if a < b:
                out.append(Segment(p, ds + a - base, ds + b - base, ds))
        base += length
    return out


def seek_segment(f, seg: Segment) -> int:
    """Position the binary file ``f`` at the first line of ``seg`` (the first line start at or after
    ``seg.start``) and return that offset; it is ``>= seg.stop`` when the segment holds no line start.
    Reads only the tail of the line that crosses ``seg.start`` (it belongs to the shard before)."""
    if seg.start <= seg.data_start:
        f.seek(seg.data_start)
        return seg.data_start
    pos = seg.start - 1  # a line starts at `start` exactly when byte start - 1 is a newline
    f.seek(pos)
    while True:
        block = f.read(SCAN_BYTES)
        if not block:
            return pos
        i = block.find(b"\n")
        if i >= 0:
            pos += i + 1
            f.seek(pos)
            return pos
        pos += len(block)


def split_segments(segments: list[Segment], cuts: dict) -> list[Segment]:
    """``segments`` cut at the offsets ``cuts[path]`` (a set of ints) that fall inside them: the same
    lines (or rows) in the same order, in finer pieces (a line belongs to the piece it starts in). A
    whole-stream segment (``stop`` None: a compressed file) is never cut. Pure."""
    out = []
    for seg in segments:
        if seg.stop is None:
            out.append(seg)
            continue
        inner = sorted(c for c in cuts.get(seg.path, ()) if seg.start < c < seg.stop)
        edges = [seg.start, *inner, seg.stop]
        out.extend(Segment(seg.path, a, b, seg.data_start) for a, b in zip(edges, edges[1:]))
    return out


def row_segments(paths, file_rows, lo: int, hi: int) -> list[Segment]:
    """Rows ``[lo, hi)`` of files laid end to end (``file_rows[i]`` rows in ``paths[i]``) as segments of
    rows of one file each (``start``/``stop`` rows of that file). Pure."""
    out, base = [], 0
    for p, n in zip(paths, file_rows):
        a, b = max(lo, base), min(hi, base + n)
        if a < b:
            out.append(Segment(p, a - base, b - base, 0))
        base += n
    return out
