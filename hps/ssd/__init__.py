"""SSD-PS: the append-only SSD parameter store (``SSDStore``) and its on-disk format constants.

::

    from hps.ssd import SSDStore
    with SSDStore(path, dim=32) as s:
        s.dump(keys, rows)            # durable when it returns
        rows, found = s.load(keys)

The file format is documented in :mod:`hps.ssd._format`.
"""

from ._env import PosixEnv, ScratchEnv
from ._format import (
    DTYPE_CODES,
    FLAG_TOMBSTONES,
    FLAG_VERSIONS,
    FORMAT_TOMBSTONES,
    FORMAT_V1,
    FORMAT_VERSION,
    HEADER_SIZE,
    HEADER_STRUCT,
    HEADER_V2_STRUCT,
    MAGIC,
    MANIFEST_MAGIC,
    MANIFEST_STRUCT,
    ROWS_ALIGN,
    STORE_MAGIC,
    STORE_STRUCT,
)
from ._store import SSDOptions, SSDStore

__all__ = [
    "SSDStore",
    "SSDOptions",
    "PosixEnv",
    "ScratchEnv",
    "MAGIC",
    "STORE_MAGIC",
    "FORMAT_VERSION",
    "FORMAT_V1",
    "FORMAT_TOMBSTONES",
    "HEADER_STRUCT",
    "HEADER_V2_STRUCT",
    "MANIFEST_MAGIC",
    "MANIFEST_STRUCT",
    "ROWS_ALIGN",
    "HEADER_SIZE",
    "STORE_STRUCT",
    "FLAG_VERSIONS",
    "FLAG_TOMBSTONES",
    "DTYPE_CODES",
]
