"""The file-system interface of the SSD-PS (LevelDB's ``Env``): every file operation goes through it.

Tests subclass :class:`PosixEnv` to inject faults (ENOSPC, short writes, flipped bytes) or to record
which calls happen (fsync of files and directories). Paths are ``str``. Errors are ``OSError``.

Thread-safe: methods hold no state beyond the OS's (a subclass that records calls must lock).
"""

from __future__ import annotations

import errno
import os

import numpy as np

from . import _read_kernels as K
from ._native import PREAD

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None


class PosixEnv:
    """Plain POSIX files. A write handle is an ``int`` file descriptor."""

    # -- writing ------------------------------------------------------------------------------
    def open_write(self, path: str) -> int:
        """Create ``path`` (truncating it) for writing -> handle."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, handle: int, data) -> None:
        """Write all of ``data`` (bytes-like) at the handle's position; loops over partial writes."""
        mv = memoryview(data).cast("B")
        while len(mv):
            n = os.write(handle, mv)
            mv = mv[n:]

    def fsync(self, handle: int) -> None:
        os.fsync(handle)

    def close(self, handle: int) -> None:
        os.close(handle)

    def write_file(self, path: str, data) -> None:
        """Create ``path`` holding exactly ``data``, fsynced (not yet renamed into place)."""
        h = self.open_write(path)
        try:
            self.write(h, data)
            self.fsync(h)
        finally:
            self.close(h)

    # -- names --------------------------------------------------------------------------------
    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` by ``src`` (same directory)."""
        os.replace(src, dst)

    def remove(self, path: str) -> None:
        os.remove(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def fsync_dir(self, path: str) -> None:
        """Make renames/creations/removals in directory ``path`` durable."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def mkdir(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    # -- reading ------------------------------------------------------------------------------
    def open_read(self, path: str, direct: bool = False, random: bool = False) -> int:
        """Open ``path`` for reading -> handle (close it with :meth:`close`). ``direct``: bypass the
        page cache (``O_DIRECT``: offsets, sizes and buffers of reads must be 4096-aligned); where the
        file system refuses it (EINVAL, e.g. tmpfs) the file is opened buffered. ``random``: no
        readahead (``POSIX_FADV_RANDOM``)."""
        if direct and hasattr(os, "O_DIRECT"):
            try:
                return os.open(path, os.O_RDONLY | os.O_DIRECT)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
        fd = os.open(path, os.O_RDONLY)
        if random and hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            except OSError:
                pass
        return fd

    def read_into(self, handle: int, offset: int, buf) -> int:
        """Fill the writable buffer ``buf`` from ``offset`` of an open file -> bytes read (fewer at EOF)."""
        mv = memoryview(buf).cast("B")
        size, got = len(mv), 0
        while got < size:
            n = os.preadv(handle, [mv[got:]], offset + got)
            if n == 0:
                break
            got += n
        return got

    def native_pread(self):
        """The ctypes ``pread`` (``hps.ssd._native.PREAD``) that nogil kernels may call on this Env's
        read handles instead of :meth:`read_into` / :meth:`read_many`; None where there is none or
        a subclass overrides either (its reads must go through it)."""
        cls = type(self)
        if cls.read_into is PosixEnv.read_into and cls.read_many is PosixEnv.read_many:
            return PREAD
        return None

    def read_many(self, handles, offsets, sizes, buf, buf_offsets) -> np.ndarray:
        """A list of reads: read ``j`` fills ``buf[buf_offsets[j]:][:sizes[j]]`` from ``handles[j]``
        at ``offsets[j]`` -> (r,) int64 bytes read by each (fewer at EOF; -1 on an error of the
        kernel path: the caller repeats that read with :meth:`read_into` to raise its OSError).
        handles, offsets, sizes, buf_offsets (r,) int64; buf (m,) uint8, C order, host. Blocking.

        One call of a nogil kernel issues them all (``hps.ssd._native``: no GIL taken per read, so
        Python threads elsewhere in the process cannot stall it). A subclass that overrides
        :meth:`read_into` (to inject faults) gets one ``read_into`` call per read instead."""
        got = np.empty(handles.shape[0], dtype=np.int64)
        if PREAD is not None and type(self).read_into is PosixEnv.read_into:
            K.pread_many(PREAD, handles, offsets, sizes, buf, buf_offsets, got)
            return got
        mv = memoryview(buf)
        for j, (h, off, n, b) in enumerate(zip(handles.tolist(), offsets.tolist(), sizes.tolist(),
                                               buf_offsets.tolist())):
            got[j] = self.read_into(h, off, mv[b:b + n])   # an OSError propagates as it is
        return got

    def drop_cache(self, handle: int, offset: int = 0, size: int = 0) -> None:
        """Ask the OS to drop cached pages of [offset, offset + size) (0: to the end) of an open file
        (``posix_fadvise(DONTNEED)``; a hint, no error)."""
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(handle, offset, size, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass

    def pread(self, handle: int, offset: int, size: int, into=None):
        """``size`` bytes at ``offset`` of an open file (fewer at EOF).

        ``into``: optional callable ``n -> writable buffer of at least n bytes`` to read into (a
        reused buffer saves allocating and page-faulting a new one per read); the result is then a
        memoryview of it, valid until the buffer is reused. Otherwise a new bytearray."""
        buf = bytearray(size) if into is None else memoryview(into(size)).cast("B")[:size]
        mv = memoryview(buf)
        got = 0
        while got < size:
            n = os.preadv(handle, [mv[got:]], offset + got)
            if n == 0:
                break
            got += n
        return buf if got == size else buf[:got]

    def read(self, path: str, offset: int = 0, size: int = -1, into=None):
        """Bytes [offset, offset+size) of ``path`` (to the end when size < 0); fewer at EOF.
        ``into`` as in :meth:`pread`."""
        fd = self.open_read(path)
        try:
            if size < 0:
                size = max(0, os.fstat(fd).st_size - offset)
            return self.pread(fd, offset, size, into)
        finally:
            self.close(fd)

    # -- locking ------------------------------------------------------------------------------
    def lock(self, path: str):
        """Take an exclusive advisory lock on ``path`` (created) -> handle; BlockingIOError if held."""
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise
        return fd

    def unlock(self, handle) -> None:
        if fcntl is not None:
            fcntl.flock(handle, fcntl.LOCK_UN)
        os.close(handle)


DEFAULT_ENV = PosixEnv()


class ScratchEnv(PosixEnv):
    """POSIX files without fsync: for a store used as scratch space whose durability comes from
    elsewhere (the trainer's SSD-PS: a run restarts from its checkpoint, never from the store).
    A dump that returned survives a process crash (the OS has the bytes) but not power loss."""

    def fsync(self, handle: int) -> None:
        pass

    def fsync_dir(self, path: str) -> None:
        pass
