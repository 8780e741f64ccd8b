"""On-disk format of the SSD-PS. Every constant here is written to disk: never renumber.

A store is a directory::

    STORE                      store descriptor (magic, format version, dtype code, dim), written once
    LOCK                       advisory lock (flock) held while a process has the store open
    <seq:016x>.param           parameter files, one per sequence number (hex, zero-padded)
    <seq:016x>.param.tmp       a file being written; never acknowledged, deleted on open

Store descriptor ``STORE`` (little-endian, ``STORE_STRUCT`` = ``<8sHHI4xI``, 24 bytes)::

    magic "HPSSTORE" | format_version u16 | dtype_code u16 | dim u32 | 4 pad bytes | crc32 u32
    (crc32 = zlib.crc32 of the 20 bytes before it)

Parameter file (little-endian)::

    offset 0            header, HEADER_SIZE = 64 bytes (HEADER_STRUCT = ``<8sHHIIQQII``, zero padded):
                          magic "HPSPARAM" 8s | format_version u16 | dtype_code u16 | dim u32 |
                          flags u32 | seq u64 | n_rows u64 | keys_crc u32 | data_crc u32 |
                          ... zero padding to byte 60 ... | header_crc u32 at byte 60
                          (header_crc = zlib.crc32 of bytes 0..59)
    64                  keys      (n_rows,) uint64
    64 + 8 n            versions  (n_rows,) uint64   -- only when flags & FLAG_VERSIONS
    then                rows      (n_rows, dim) of the dtype, C order
    keys_crc  = zlib.crc32 of keys + versions sections (checked when the store is opened)
    data_crc  = zlib.crc32 of the rows section (checked every time the file is read for rows)

The *version* of a row is the sequence number of the ``dump`` that wrote it. A file written by
``dump`` has no versions section: all its rows have version ``seq``. A file written by compaction
carries the version of each row's source (``FLAG_VERSIONS``), so a merged file never overrides a
newer dump. On open, for every key the row with the highest version wins (ties: the higher file
sequence number; both copies hold the same bytes; then the higher slot, so a key repeated within
one dump resolves to its last occurrence, as ``dump`` does).
"""

from __future__ import annotations

import re
import struct
import zlib

import numpy as np

from ..errors import CorruptionError, StoreFormatError

try:   # ISA-L's CRC-32: the same values as zlib.crc32, ~4x faster (10 vs 2.4 GB/s here); GIL released
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib computes the same checksums
    crc32 = zlib.crc32

# -- written to disk, never renumber ----------------------------------------------------------------
#: Magic of a parameter file.
MAGIC = b"HPSPARAM"
#: Magic of the store descriptor file ``STORE``.
STORE_MAGIC = b"HPSSTORE"
#: Format version of both file kinds. Bump on any layout change; readers refuse newer versions.
FORMAT_VERSION = 1
#: Header of a parameter file: magic, version, dtype code, dim, flags, seq, n_rows, keys_crc, data_crc.
HEADER_STRUCT = struct.Struct("<8sHHIIQQII")
#: Bytes reserved for the header; the header CRC is the last 4 of them.
HEADER_SIZE = 64
#: Offset of the header CRC (crc32 of bytes [0, HEADER_CRC_OFFSET)).
HEADER_CRC_OFFSET = HEADER_SIZE - 4
#: Store descriptor: magic, version, dtype code, dim, 4 pad bytes, crc32 of the preceding bytes.
STORE_STRUCT = struct.Struct("<8sHHI4xI")
#: Header flag: the file has a per-row versions section (files written by compaction).
FLAG_VERSIONS = 1
#: dtype code -> dtype of the rows. Written to disk, never renumber.
DTYPE_CODES = {1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<f2"), 4: np.dtype("<i4"),
               5: np.dtype("<i8")}
# ----------------------------------------------------------------------------------------------------

CODE_OF_DTYPE = {dt: code for code, dt in DTYPE_CODES.items()}
STORE_FILE = "STORE"
LOCK_FILE = "LOCK"
PARAM_SUFFIX = ".param"
TMP_SUFFIX = ".param.tmp"
_PARAM_RE = re.compile(r"^([0-9a-f]{16})\.param$")
_TMP_RE = re.compile(r"^([0-9a-f]{16})\.param\.tmp$")


def dtype_code(dtype) -> int:
    dt = np.dtype(dtype).newbyteorder("<")
    if dt not in CODE_OF_DTYPE:
        names = ", ".join(str(d) for d in DTYPE_CODES.values())
        raise StoreFormatError(f"dtype {np.dtype(dtype)} cannot be stored; supported: {names}")
    return CODE_OF_DTYPE[dt]


def param_name(seq: int) -> str:
    return f"{seq:016x}{PARAM_SUFFIX}"


def tmp_name(seq: int) -> str:
    return f"{seq:016x}{TMP_SUFFIX}"


def parse_name(name: str):
    """-> ("param" | "tmp", seq) for store file names, None for anything else."""
    m = _PARAM_RE.match(name)
    if m:
        return "param", int(m.group(1), 16)
    m = _TMP_RE.match(name)
    if m:
        return "tmp", int(m.group(1), 16)
    return None


def pack_store(code: int, dim: int) -> bytes:
    body = STORE_STRUCT.pack(STORE_MAGIC, FORMAT_VERSION, code, dim, 0)[:-4]
    return body + struct.pack("<I", crc32(body))


def unpack_store(buf: bytes, where: str):
    """-> (dtype code, dim); StoreFormatError when ``buf`` is not a store descriptor."""
    if len(buf) != STORE_STRUCT.size:
        raise StoreFormatError(f"{where} is not an hps SSD store descriptor (size {len(buf)})")
    magic, version, code, dim, crc = STORE_STRUCT.unpack(buf)
    if magic != STORE_MAGIC:
        raise StoreFormatError(f"{where} is not an hps SSD store descriptor (bad magic)")
    if crc32(buf[:-4]) != crc:
        raise CorruptionError(f"{where}: store descriptor checksum mismatch")
    if version > FORMAT_VERSION:
        raise StoreFormatError(f"{where}: format version {version} is newer than this reader "
                               f"({FORMAT_VERSION})")
    if code not in DTYPE_CODES:
        raise StoreFormatError(f"{where}: unknown dtype code {code}")
    return code, dim


def layout(n_rows: int, dim: int, itemsize: int, has_versions: bool):
    """-> (versions_offset or -1, rows_offset, file_size) of a parameter file."""
    off = HEADER_SIZE + 8 * n_rows
    voff = -1
    if has_versions:
        voff = off
        off += 8 * n_rows
    return voff, off, off + n_rows * dim * itemsize


def pack_header(code: int, dim: int, flags: int, seq: int, n_rows: int, keys_crc: int,
                data_crc: int) -> bytes:
    buf = bytearray(HEADER_SIZE)
    HEADER_STRUCT.pack_into(buf, 0, MAGIC, FORMAT_VERSION, code, dim, flags, seq, n_rows, keys_crc,
                            data_crc)
    struct.pack_into("<I", buf, HEADER_CRC_OFFSET, crc32(memoryview(buf)[:HEADER_CRC_OFFSET]))
    return bytes(buf)


class Header:
    """Decoded, checked header of a parameter file."""

    __slots__ = ("code", "dim", "flags", "seq", "n_rows", "keys_crc", "data_crc", "versions_offset",
                 "rows_offset", "size")

    def __init__(self, buf, where: str, file_size: int):
        if len(buf) < HEADER_SIZE:
            raise CorruptionError(f"{where}: truncated header ({len(buf)} of {HEADER_SIZE} bytes)")
        mv = memoryview(buf)[:HEADER_SIZE]
        (magic, version, code, dim, flags, seq, n_rows, kcrc, dcrc) = HEADER_STRUCT.unpack_from(mv, 0)
        (hcrc,) = struct.unpack_from("<I", mv, HEADER_CRC_OFFSET)
        if crc32(mv[:HEADER_CRC_OFFSET]) != hcrc or magic != MAGIC:
            raise CorruptionError(f"{where}: header checksum mismatch or bad magic")
        if version > FORMAT_VERSION:
            raise StoreFormatError(f"{where}: format version {version} is newer than this reader "
                                   f"({FORMAT_VERSION})")
        if code not in DTYPE_CODES:
            raise CorruptionError(f"{where}: unknown dtype code {code}")
        self.code, self.dim, self.flags, self.seq, self.n_rows = code, dim, flags, seq, n_rows
        self.keys_crc, self.data_crc = kcrc, dcrc
        self.versions_offset, self.rows_offset, self.size = layout(
            n_rows, dim, DTYPE_CODES[code].itemsize, bool(flags & FLAG_VERSIONS))
        if file_size != self.size:
            raise CorruptionError(f"{where}: file is {file_size} bytes, header says {self.size}")

    def keys_section_end(self) -> int:
        return self.rows_offset


def parse_keys(buf, hdr: Header, where: str):
    """Check keys_crc; -> (keys (n,) uint64, versions (n,) uint64). ``buf`` holds bytes [0, rows_offset)."""
    mv = memoryview(buf)
    if len(mv) < hdr.rows_offset:
        raise CorruptionError(f"{where}: truncated keys section")
    if crc32(mv[HEADER_SIZE:hdr.rows_offset]) != hdr.keys_crc:
        raise CorruptionError(f"{where}: keys section checksum mismatch")
    keys = np.frombuffer(buf, dtype="<u8", count=hdr.n_rows, offset=HEADER_SIZE).astype(np.uint64)
    if hdr.versions_offset >= 0:
        versions = np.frombuffer(buf, dtype="<u8", count=hdr.n_rows,
                                 offset=hdr.versions_offset).astype(np.uint64)
    else:
        versions = np.full(hdr.n_rows, hdr.seq, dtype=np.uint64)
    return keys, versions


def parse_rows(buf, hdr: Header, where: str) -> np.ndarray:
    """Check data_crc; -> rows (n, dim) read-only view of ``buf`` (the whole file)."""
    mv = memoryview(buf)
    if len(mv) != hdr.size:
        raise CorruptionError(f"{where}: file is {len(mv)} bytes, header says {hdr.size}")
    if crc32(mv[hdr.rows_offset:]) != hdr.data_crc:
        raise CorruptionError(f"{where}: rows section checksum mismatch")
    dt = DTYPE_CODES[hdr.code]
    return np.frombuffer(buf, dtype=dt, count=hdr.n_rows * hdr.dim,
                         offset=hdr.rows_offset).reshape(hdr.n_rows, hdr.dim)
