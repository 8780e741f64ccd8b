"""HDF5 files written so that a failed write (a full disk, an I/O error) is one Python exception.

Given a path, h5py writes through the HDF5 library's own file driver. When a write fails there, HDF5
reports it; closing the file then flushes its caches, which fails again and leaves the file
half-closed inside the library, and every h5py object freed afterwards prints ``Exception ignored
in: 'h5py._objects.ObjectID.__dealloc__'`` with a traceback (or the process crashes at exit) — a
screen of noise around the one line that matters, and a descriptor (and the disk space of a
removed file) held until the process ends.

:func:`h5_output` opens the file on a Python file object instead (h5py's "fileobj" driver) that
never reports a failed write to HDF5 (a write may happen inside an object's deallocation, where an
error cannot be raised): it keeps the first error and drops that write and every later one, so
HDF5 goes on and closes the file cleanly. Small dropped writes (HDF5's metadata, which it may read
back) are kept in memory and served to later reads, so the library's view of its own file stays
consistent; large ones (raw data chunks) are not kept — their content does not matter any more.
On leaving the ``with`` block the file is closed and that first error is raised (an ``OSError``
with its errno: ENOSPC for a full disk). The call that was writing finishes its pass first (its
writes cost no I/O then). The file's content is garbage: the caller removes it
(``_checkpoint._undo_on_error``).

Not thread-safe: one writer per file.
"""

from __future__ import annotations

import io
import os
from contextlib import contextmanager

#: Modes of :func:`h5_output` -> open flags: create (truncating) or update an existing file.
_FLAGS = {"w": os.O_RDWR | os.O_CREAT | os.O_TRUNC, "a": os.O_RDWR}
#: Dropped writes up to this size are kept for later reads (HDF5 metadata blocks are a few KiB).
_KEEP_BYTES = 64 << 10


class _GuardedFile(io.RawIOBase):
    """A read/write file object for h5py that never fails a write (see the module docstring):
    ``error`` is the first failed write; from it on, writes are dropped."""

    _raw = io.FileIO  # tests put a failing one here

    def __init__(self, path, mode: str):
        super().__init__()
        self.path = os.fspath(path)
        self._f = self._raw(os.open(self.path, _FLAGS[mode], 0o644), "r+", closefd=True)
        self.error: OSError | None = None
        self._kept: list[tuple[int, bytes]] = []  # small dropped writes (offset, bytes), in order

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, b) -> int:
        if not self._kept:
            return self._f.readinto(b)
        mv = memoryview(b).cast("B")
        pos = self._f.tell()
        n = self._f.readinto(mv) or 0
        mv[n:] = bytes(len(mv) - n)  # past the end: zeros, as HDF5 reads them
        for off, data in self._kept:  # later writes win
            a, z = max(pos, off), min(pos + len(mv), off + len(data))
            if a < z:
                mv[a - pos:z - pos] = data[a - off:z - off]
        self._f.seek(pos + len(mv))
        return len(mv)

    def write(self, b) -> int:
        mv = memoryview(b).cast("B")
        n, pos = len(mv), self._f.tell()
        if self.error is None:
            try:
                while len(mv):  # FileIO.write may write a part of it
                    mv = mv[self._f.write(mv):]
                return n
            except OSError as e:
                self.error = e
                mv = memoryview(b).cast("B")
        if n <= _KEEP_BYTES:
            self._kept.append((pos, bytes(mv)))
        self._f.seek(pos + n)
        return n

    def truncate(self, size=None) -> int:
        size = self.tell() if size is None else size
        if self.error is None:
            try:
                self._f.truncate(size)
            except OSError as e:
                self.error = e
        return size

    def flush(self) -> None:
        pass  # unbuffered

    def sync(self) -> None:
        """fsync the file (unless a write failed already)."""
        if self.error is None:
            try:
                os.fsync(self._f.fileno())
            except OSError as e:
                self.error = e

    def __repr__(self) -> str:  # h5py names the HDF5 file after it
        return f"<hps HDF5 output {self.path}>"

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


@contextmanager
def h5_output(path, mode: str = "w", durable: bool = True):
    """``with h5_output(path) as h:`` write the h5py.File ``h``. ``mode``: "w" creates or truncates
    ``path``; "a" updates an existing file. On leaving, the file is closed and fsynced
    (``durable``), and the first failed write, if any, is raised as its ``OSError`` (errno set),
    whatever else was raised meanwhile (once a write is lost, HDF5 may fail on what it reads back).
    Blocks."""
    import h5py

    f = _GuardedFile(path, mode)
    try:
        h = h5py.File(f, "w" if mode == "w" else "r+")
        try:
            yield h
        finally:
            h.close()
        if durable:
            f.sync()
    except BaseException:
        if f.error is None:
            raise
    finally:
        f.close()
    if f.error is not None:
        raise f.error
