"""A checkpoint's ``meta.json``: its position, shape and the checksum of every file, itself checksummed.
(An export's ``model.json`` is written and checked the same way: ``_export``.)

``meta.json`` (version 2) is one JSON object::

    {"batch": 5, "crc32": 2369417889, "epoch": 0,
     "files": {"dense.h5": {"bytes": 23608, "crc32": 2405958987},
               "sparse-rank0-of-1.h5": {"bytes": 480912, "crc32": 4002228239}},
     "index": 5, "ranks": 1, "row_width": 16, "version": 2}

``files`` names every file of the checkpoint with its size and CRC-32 (zlib's polynomial, computed
by ISA-L); ``crc32`` is the CRC-32 of the object's canonical form without it (UTF-8 JSON, keys
sorted, no whitespace: :func:`_canonical`), so a damaged ``meta.json`` cannot vouch for damaged
files. Version 1 (before checksums) had no ``files`` and no ``crc32``; it is still read, unverified.

Every check raises :class:`~hps.errors.CorruptionError` naming the damaged file, in one line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import CorruptionError, StoreFormatError
from ..ssd._format import crc32  # ISA-L's CRC-32 (~10 GB/s), zlib's values

#: Version of the checkpoint layout, stored in meta.json. Written to disk: never renumber.
#: 1: no checksums; 2: ``files`` (bytes, crc32 of each file) and ``crc32`` of meta.json itself.
CHECKPOINT_VERSION = 2
#: Versions this code reads.
READABLE_VERSIONS = (1, 2)
META_FILE = "meta.json"
#: File of an export (and of a checkpoint) that describes the model and its input (JSON; its layout:
#: ``hps.train._records``).
EXPORT_META = "model.json"
#: Layout version of ``EXPORT_META``; written to disk, never renumber. 1: no checksums; 2: ``files``
#: and ``crc32`` (the export is switched in atomically, ``_export``).
EXPORT_VERSION = 2
#: Keys of meta.json (written to disk: never rename).
CRC_KEY, FILES_KEY = "crc32", "files"
_POSITION_KEYS = ("index", "epoch", "batch", "ranks", "row_width")
_CHUNK = 16 << 20


def file_record(path: Path) -> dict:
    """``{"bytes": size, "crc32": crc}`` of a file, read in 16 MiB chunks. Blocks."""
    size, crc = 0, 0
    with open(path, "rb", buffering=0) as f:
        buf = memoryview(bytearray(max(1, min(_CHUNK, os.fstat(f.fileno()).st_size))))
        while n := f.readinto(buf):
            crc = crc32(buf[:n], crc)
            size += n
    return {"bytes": size, CRC_KEY: crc}


def verify_file(path: Path, record: dict, what: str = "checkpoint", manifest: str = META_FILE) -> None:
    """Raise CorruptionError unless ``path`` has the size and CRC-32 of ``record`` (as recorded in
    ``manifest``, of the ``what`` that holds the file: for the message)."""
    if not path.is_file():
        raise CorruptionError(f"{path} is missing: the {what} is incomplete")
    got = file_record(path)
    if got["bytes"] != record["bytes"]:
        raise CorruptionError(f"{path} has {got['bytes']} bytes, {manifest} records {record['bytes']}: "
                              "the file is truncated or damaged")
    if got[CRC_KEY] != record[CRC_KEY]:
        raise CorruptionError(f"{path} fails its CRC-32 check (the file is damaged)")


def write_meta(path: Path, meta: dict) -> None:
    """Write ``meta`` (without ``crc32``) as JSON with its checksum, fsynced (meta.json of a
    checkpoint; model.json of an export)."""
    full = dict(meta, **{CRC_KEY: crc32(_canonical(meta))})
    with open(path, "w") as f:
        json.dump(full, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def read_checked(path: Path, what: str = "checkpoint") -> tuple[dict, bool]:
    """A JSON object written by :func:`write_meta` -> (the object without ``crc32``, whether it had
    one: files of older versions have none). CorruptionError when ``path`` is missing (the ``what``
    is incomplete), not a JSON object, or fails its checksum."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CorruptionError(f"{path} is missing: the {what} is incomplete") from None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise CorruptionError(f"{path} is damaged: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise CorruptionError(f"{path} is damaged: not a JSON object")
    if CRC_KEY not in obj:
        return obj, False
    body = {k: v for k, v in obj.items() if k != CRC_KEY}
    if crc32(_canonical(body)) != obj[CRC_KEY]:
        raise CorruptionError(f"{path} fails its CRC-32 check (the file is damaged)")
    return body, True


def read_meta(path: Path) -> dict:
    """meta.json, checked -> the dict (version 1: without ``files``). CorruptionError when it is
    missing or damaged; StoreFormatError when it is intact but of a version this code cannot read."""
    meta, checked = read_checked(path)
    if not checked and meta.get("version") != 1:  # only version 1 went without a checksum
        raise CorruptionError(f"{path} is damaged: it has no {CRC_KEY!r} checksum")
    version = meta.get("version")
    if version not in READABLE_VERSIONS:
        raise StoreFormatError(f"{path} has checkpoint version {version}; this hps reads versions "
                               f"{', '.join(map(str, READABLE_VERSIONS))}")
    wanted = _POSITION_KEYS + ((FILES_KEY,) if version >= 2 else ())
    missing = [k for k in wanted if k not in meta]
    if missing:
        raise CorruptionError(f"{path} is damaged: it lacks {', '.join(missing)}")
    return meta


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode("utf-8")
