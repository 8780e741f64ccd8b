"""Shards of the data: which bytes (or rows) shard ``s`` of ``K`` reads, so no reader parses another's.

Text files are cut into *segments*, nominal byte ranges ``[start, stop)`` of one file. A reader of a
segment reads exactly the lines that **start** inside it: it skips the partial line at ``start``
(unless ``start`` is where the file's data begins) and finishes the line that runs past ``stop``.
Every line therefore belongs to exactly one shard, and the shards of a file, read one after the other,
give its lines in order.

- At least ``K`` files: shard ``s`` reads whole files, the contiguous run
  ``files[share_bounds(F, s, K)]`` (in the order given).
- Fewer files than shards: the files' data regions (after a CSV header) are laid end to end and cut
  into ``K`` byte ranges holding about as many lines each (:func:`region_lines` samples where the
  lines are; equal byte lengths when the plan is given no sample); a range may span the end of one
  file and the start of the next (two segments). A file that cannot be cut (a compressed one,
  ``splittable`` False) is read whole by the shard whose byte range holds its first byte (its length
  is its compressed size; with such a file the ranges are of equal byte lengths).

Why lines, not bytes: a shard's examples are what its rank trains on, and a file whose lines differ in
length along it (empty fields early on, longer records later) cut into equal byte ranges gives one rank
several times the examples of another, and so several times the work, while the others wait in every
collective and run empty mini-batches after their shards end.

Rows (synthetic data) are cut with :func:`share_bounds` as well.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InvalidInputError

#: The rule that cuts plain files into shards (where the lines are, :func:`region_lines`), as a checkpoint
#: records it: a resumed job must cut its data as the job that wrote the checkpoint did. Checkpoints
#: of hps before 2026-11-27 record none: those jobs cut files by equal byte lengths.
SHARD_CUT = "lines-64x16KiB"
#: Bytes read per step while looking for the newline that ends a partial line.
SCAN_BYTES = 1 << 16
#: Where the lines of a file are (:func:`region_lines`): its data region is cut into this many equal
#: regions, and the newlines of the first :data:`DENSITY_WINDOW` bytes of each are counted (1 MiB read per
#: file; a smaller file is counted whole).
DENSITY_REGIONS = 64
DENSITY_WINDOW = 1 << 14


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


def region_lines(path, data_start: int, size: int) -> np.ndarray:
    """(DENSITY_REGIONS,) float64: the lines estimated to start in each of the equal regions of the
    data region ``[data_start, size)`` of the plain file ``path`` (newlines counted in a window at the start
    of each region, scaled to its length; exact when the windows cover the regions). The same answer on
    every rank for the same file; remembered per (path, size, mtime). Reads at most DENSITY_REGIONS x
    DENSITY_WINDOW bytes."""
    st = os.stat(path)
    return _region_lines(str(path), int(data_start), int(size), st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _region_lines(path: str, data_start: int, size: int, mtime_ns: int) -> np.ndarray:
    length = max(0, size - data_start)
    edges = [data_start + i * length // DENSITY_REGIONS for i in range(DENSITY_REGIONS + 1)]
    out = np.zeros(DENSITY_REGIONS, np.float64)
    with open(path, "rb") as f:
        for i, (a, b) in enumerate(zip(edges, edges[1:])):
            if b <= a:
                continue
            f.seek(a)
            window = f.read(min(DENSITY_WINDOW, b - a))
            if window:
                out[i] = window.count(b"\n") * (b - a) / len(window)
    return out


def _balanced_bounds(lengths, lines, shard: int, n_shards: int, total: int) -> tuple[int, int]:
    """[lo, hi) bytes of shard ``shard`` in the data regions laid end to end (``lengths``), the cuts where
    the estimated lines (``lines``: per file, its regions' :func:`region_lines`) reach s / K of them;
    equal byte lengths when ``lines`` is None or estimates no line."""
    if lines is not None:
        widths = np.concatenate([np.diff([i * n // len(est) for i in range(len(est) + 1)])
                                 for n, est in zip(lengths, lines)]).astype(np.float64)
        est = np.concatenate([np.asarray(e, np.float64) for e in lines])
        if est.shape == widths.shape and est.sum() > 0:
            cum_lines, cum_bytes = np.concatenate([[0.0], np.cumsum(est)]), np.concatenate([[0.0], np.cumsum(widths)])
            targets = np.array([shard, shard + 1], np.float64) * cum_lines[-1] / n_shards
            # bytes where the cumulative estimate reaches each target (linear inside a region)
            lo, hi = (int(round(x)) for x in np.interp(targets, cum_lines, cum_bytes))
            return (0 if shard == 0 else lo), (total if shard == n_shards - 1 else hi)
    return shard * total // n_shards, (shard + 1) * total // n_shards


def plan_segments(paths, data_starts, sizes, shard: int, n_shards: int, splittable=None,
                  lines=None) -> list[Segment]:
    """Segments of shard ``shard`` of ``n_shards`` over ``paths`` (file sizes ``sizes`` in bytes, data
    beginning at ``data_starts``; ``splittable`` (one bool per file, default all True): whether a
    file may be cut into byte ranges; ``lines``: per file, :func:`region_lines` of it, to cut where the
    lines are, or None to cut equal byte lengths); see the module docstring. Pure: reads nothing."""
    paths, n = list(paths), len(paths)
    cut = list(splittable) if splittable is not None else [True] * n
    if n >= n_shards:
        a, b = share_bounds(n, shard, n_shards)
        return [Segment(paths[i], data_starts[i], sizes[i] if cut[i] else None, data_starts[i])
                for i in range(a, b)]
    lengths = [max(0, sz - ds) for sz, ds in zip(sizes, data_starts)]
    total = sum(lengths)
    lo, hi = _balanced_bounds(lengths, lines if all(cut) else None, shard, n_shards, total)
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
