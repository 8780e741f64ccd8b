"""Where the data comes from: expanding ``--data`` into files, and opening each one as a byte stream.

``expand_paths(path)``: a file, a directory (its regular files not starting with ``.``, sorted by
name), a glob pattern (``*``, ``?``, ``[``; sorted matches) or a sequence of any of these -> the data
files, in order. A missing file, an empty directory or a pattern that matches nothing raises
:class:`DataFileNotFoundError` naming it.

``open_source(path)``: a binary, read-only, *streaming* file object (``read(n)``, ``readline()``) of
the file's bytes — decompressed on the fly when its name ends in ``.gz`` (gzip, also multi-member;
through ``isal`` when installed) or ``.zst`` (zstandard, also multi-frame). Nothing is read whole
into memory. A compressed file cannot be cut into byte ranges (``hps.data._shards``): it is read
whole by one shard.
"""

from __future__ import annotations

import glob
import io
import os
from pathlib import Path

from ..errors import InvalidInputError

#: File name suffix -> compression, and the magic bytes its files start with.
COMPRESSIONS = {".gz": ("gzip", b"\x1f\x8b"), ".zst": ("zstandard", b"\x28\xb5\x2f\xfd")}


class DataFileNotFoundError(InvalidInputError, FileNotFoundError):
    """A data file does not exist (an ``InvalidInputError`` and a ``FileNotFoundError``)."""


def compression(path) -> str | None:
    """"gzip", "zstandard" or None (plain), from the file name's suffix."""
    entry = COMPRESSIONS.get(Path(path).suffix.lower())
    return entry[0] if entry else None


def _expand_one(text: str) -> list[Path]:
    p = Path(text)
    if p.is_dir():
        paths = sorted(q for q in p.iterdir() if q.is_file() and not q.name.startswith("."))
        if not paths:
            raise DataFileNotFoundError(f"data directory {text} holds no data file")
        return paths
    if any(c in text for c in "*?[") and not p.exists():
        paths = [Path(x) for x in sorted(glob.glob(text)) if Path(x).is_file()]
        if not paths:
            raise DataFileNotFoundError(f"no data file matches {text}")
        return paths
    if not p.is_file():
        raise DataFileNotFoundError(f"data file not found: {text}")
    return [p]


def expand_paths(path) -> list[Path]:
    """Data files of ``path`` (see the module docstring), in order. Raises DataFileNotFoundError
    (missing file, empty directory, unmatched glob) or InvalidInputError (nothing given)."""
    items = [path] if isinstance(path, (str, os.PathLike)) else list(path or ())
    out = [q for item in items for q in _expand_one(os.fspath(item))]
    if not out:
        raise InvalidInputError("no data file given")
    return out


def open_source(path) -> io.BufferedIOBase:
    """Binary stream of the (decompressed) bytes of ``path``; the caller closes it. Raises
    InvalidInputError when a ``.gz`` / ``.zst`` file does not start with its format's magic bytes."""
    kind = compression(path)
    if kind is None:
        return open(path, "rb")
    magic = COMPRESSIONS[Path(path).suffix.lower()][1]
    with open(path, "rb") as f:
        head = f.read(len(magic))
    if head and head != magic:
        raise InvalidInputError(f"{path} is named like a {kind} file but is not {kind} data; rename it "
                                f"(plain text needs no suffix) or recompress it")
    if kind == "gzip":
        try:
            from isal import igzip as gzip
        except ImportError:  # pragma: no cover - isal is a dependency; gzip reads the same files
            import gzip
        return gzip.open(path, "rb")
    import zstandard

    raw = zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), read_across_frames=True,
                                                    closefd=True)
    return io.BufferedReader(raw, buffer_size=1 << 20)
