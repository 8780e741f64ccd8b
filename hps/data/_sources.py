"""Where the data comes from: expanding ``--data`` into files, and opening each one as a byte stream.

``expand_paths(path)``: a file, a directory (its regular files not starting with ``.``, sorted by
name), a glob pattern (``*``, ``?``, ``[``; sorted matches) or a sequence of any of these -> the data
files, in order. A missing file, an empty directory or a pattern that matches nothing raises
:class:`DataFileNotFoundError` naming it; an empty path (``--data ""``: ``Path("")`` is the working
directory) raises InvalidInputError.

``name_files(paths)``: the files as an error message names them (the first few, then how many more).

``open_source(path)``: a binary, read-only, *streaming* file object (``read(n)``, ``readline()``) of
the file's bytes — decompressed on the fly when its name ends in ``.gz`` (gzip, also multi-member;
through ``isal`` when installed) or ``.zst`` (zstandard, also multi-frame, skippable frames included:
``pzstd`` starts its files with one). A damaged or cut file raises InvalidInputError naming it. Nothing
is read whole into memory. A compressed file cannot be cut into byte ranges (``hps.data._shards``): it
is read whole by one shard.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path

from ..errors import HpsError, InvalidInputError

#: File name suffix -> compression, and the magic bytes its files start with.
COMPRESSIONS = {".gz": ("gzip", b"\x1f\x8b"), ".zst": ("zstandard", b"\x28\xb5\x2f\xfd")}


class DataFileNotFoundError(InvalidInputError, FileNotFoundError):
    """A data file does not exist (an ``InvalidInputError`` and a ``FileNotFoundError``)."""


def compression(path) -> str | None:
    """"gzip", "zstandard" or None (plain), from the file name's suffix."""
    entry = COMPRESSIONS.get(Path(path).suffix.lower())
    return entry[0] if entry else None


def _expand_one(text: str) -> list[Path]:
    if not text.strip():  # Path("") is ".": an unset variable (--data "$DATA") must not read the working directory
        raise InvalidInputError("an empty data path was given; name a file, a directory or a glob pattern")
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


#: Files an error message names one by one (:func:`name_files`); the others are counted.
NAMED_FILES = 3


def name_files(paths) -> str:
    """``paths`` as a message names them: all of them when few, else the first :data:`NAMED_FILES`
    and how many more (a directory of thousands of files must not make a message of thousands of names)."""
    names = [str(p) for p in paths]
    if len(names) <= NAMED_FILES + 1:
        return ", ".join(names)
    return f"{', '.join(names[:NAMED_FILES])} and {len(names) - NAMED_FILES} more files"


def _damaged_data_errors() -> tuple:
    """The exceptions a decompressing read raises on damaged or cut data: EOFError, OSError, ValueError
    and the codecs' own, which derive from Exception alone (zlib's, isal's ``IsalError``, zstandard's
    ``ZstdError``)."""
    import zlib

    errors = [EOFError, OSError, ValueError, zlib.error]
    for module, name in (("isal.isal_zlib", "error"), ("zstandard", "ZstdError")):
        try:
            errors.append(getattr(__import__(module, fromlist=[name]), name))
        except ImportError:  # pragma: no cover - both are dependencies
            pass
    return tuple(errors)


class _Decompressed:
    """A decompressing stream whose ``read`` / ``readline`` turn a damaged or truncated file's errors
    into one InvalidInputError naming the file (the libraries raise EOFError, zlib or zstd errors)."""

    def __init__(self, stream, path, kind: str):
        self._s, self._path, self._kind = stream, path, kind

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except HpsError:
            raise
        except _damaged_data_errors() as e:
            if isinstance(e, FileNotFoundError):
                raise
            raise InvalidInputError(f"{self._path}: damaged or truncated {self._kind} data ({e}); "
                                    "check the file (e.g. gzip -t / zstd -t)") from None

    def read(self, n: int = -1) -> bytes:
        return self._call(self._s.read, n)

    def readline(self) -> bytes:
        return self._call(self._s.readline)

    def close(self) -> None:
        self._s.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _ZstdReader:
    """Streaming zstandard decompression of every frame of a file, 1 MiB of input at a time, raising
    InvalidInputError when the file ends inside a frame (a truncated file; ``stream_reader`` would
    end silently)."""

    def __init__(self, path):
        import zstandard

        self._path = path
        self._f = open(path, "rb")
        self._zd = zstandard.ZstdDecompressor()
        self._d = self._zd.decompressobj()
        self._buf = bytearray()
        self._in_frame = False
        self._eof = False

    def _fill(self, n: int) -> None:
        while (n < 0 or len(self._buf) < n) and not self._eof:
            data = self._f.read(1 << 20)
            if not data:
                if self._in_frame:
                    raise InvalidInputError(f"{self._path}: damaged or truncated zstandard data (the "
                                            "file ends inside a frame); check the file (zstd -t)")
                self._eof = True
                break
            while data:
                self._in_frame = True
                try:
                    self._buf += self._d.decompress(data)
                except _damaged_data_errors() as e:
                    raise InvalidInputError(f"{self._path}: damaged zstandard data ({e}); check the file "
                                            "(zstd -t)") from None
                data = b""
                if self._d.eof:  # a frame ended: the rest of the input starts the next one
                    data = self._d.unused_data
                    self._d = self._zd.decompressobj()
                    self._in_frame = False

    def read(self, n: int = -1) -> bytes:
        self._fill(n)
        k = len(self._buf) if n < 0 else min(n, len(self._buf))
        out = bytes(self._buf[:k])
        del self._buf[:k]
        return out

    def readline(self) -> bytes:
        while True:
            i = self._buf.find(b"\n")
            if i >= 0 or self._eof:
                k = i + 1 if i >= 0 else len(self._buf)
                out = bytes(self._buf[:k])
                del self._buf[:k]
                return out
            self._fill(len(self._buf) + 1)

    def close(self) -> None:
        self._f.close()


def _skippable_frame(head: bytes) -> bool:
    """Whether a zstandard file starts with a skippable frame (magic 0x184D2A50-5F, little-endian:
    ``pzstd`` writes one first), which a reader passes over as any frame."""
    return len(head) == 4 and 0x50 <= head[0] <= 0x5F and head[1:] == b"\x2a\x4d\x18"


def open_source(path):
    """Binary stream (``read(n)``, ``readline()``, ``close()``, a context manager) of the
    (decompressed) bytes of ``path``; the caller closes it. Raises InvalidInputError when a ``.gz`` /
    ``.zst`` file does not start with its format's magic bytes, or (when read) is damaged or cut
    short."""
    kind = compression(path)
    if kind is None:
        return open(path, "rb")
    magic = COMPRESSIONS[Path(path).suffix.lower()][1]
    with open(path, "rb") as f:
        head = f.read(len(magic))
    if head and head != magic and not (kind == "zstandard" and _skippable_frame(head)):
        raise InvalidInputError(f"{path} is named like a {kind} file but is not {kind} data; rename it "
                                f"(plain text needs no suffix) or recompress it")
    if kind == "gzip":
        try:
            from isal import igzip as gzip
        except ImportError:  # pragma: no cover - isal is a dependency; gzip reads the same files
            import gzip
        return _Decompressed(gzip.open(path, "rb"), path, kind)
    return _Decompressed(_ZstdReader(path), path, kind)
