"""C functions the SSD-PS read kernels call without the GIL: libc's ``pread`` and a CRC-32 (ISA-L's,
from the ``isal`` package's extension module, else zlib's: both the CRC-32 of ``zlib.crc32``), as
ctypes function pointers that ``@njit`` kernels take as arguments (never as globals: a cached kernel
must not bake in an address).

Why: a Python thread that reads one block per call must take the GIL back after every read, and
while any other thread of the process runs Python (the trainer's stages do), each of those takes up
to the interpreter's switch interval (``bench/bench_ssd.py -k busy_neighbour``: with one busy
Python thread beside it a load ran at ~4-6 k reads/s, against ~70-120 k alone; bench/results/HISTORY.md,
"Out of core"). The kernels issue a whole list of reads, and check their blocks, in one call each.

``PREAD`` / ``CRC32`` are None where the library or symbol is missing; callers then use Python's
``os.preadv`` / ``zlib.crc32``. Pointers are passed as ``size_t`` (the same width as a pointer on
every platform hps supports).
"""

from __future__ import annotations

import ctypes
import ctypes.util


def _bind(lib, name, restype, argtypes):
    try:
        fn = getattr(lib, name)
    except AttributeError:
        return None
    fn.restype, fn.argtypes = restype, argtypes
    return fn


def _load():
    try:
        libc = ctypes.CDLL(None)
        pread = _bind(libc, "pread", ctypes.c_ssize_t,
                      [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int64])
    except OSError:  # pragma: no cover - not a POSIX libc
        pread = None
    return pread, _isal_crc32() or _zlib_crc32()


def _isal_crc32():
    """ISA-L's ``crc32_gzip_refl`` (zlib's CRC-32, ~20x faster than zlib 1.2.13 here), exported by
    the extension module of the ``isal`` package (a dependency); None if it is not there."""
    try:
        from isal import isal_zlib

        return _bind(ctypes.CDLL(isal_zlib.__file__), "crc32_gzip_refl", ctypes.c_uint32,
                     [ctypes.c_uint32, ctypes.c_size_t, ctypes.c_uint64])
    except (ImportError, OSError):  # pragma: no cover - isal is a dependency
        return None


def _zlib_crc32():
    name = ctypes.util.find_library("z")
    if not name:  # pragma: no cover
        return None
    try:
        return _bind(ctypes.CDLL(name), "crc32", ctypes.c_ulong, [ctypes.c_ulong, ctypes.c_size_t, ctypes.c_uint])
    except OSError:  # pragma: no cover
        return None


#: ``ssize_t pread(int fd, void *buf, size_t n, off_t offset)`` (buf as size_t), or None.
#: ``crc(crc, const void *buf, n)`` (buf as size_t): ISA-L's ``crc32_gzip_refl``, else zlib's
#: ``crc32`` (the same CRC-32 as ``zlib.crc32``), or None.
PREAD, CRC32 = _load()
