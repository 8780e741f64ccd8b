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
    FLAG_VERSIONS,
    FORMAT_VERSION,
    HEADER_SIZE,
    HEADER_STRUCT,
    MAGIC,
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
    "HEADER_STRUCT",
    "HEADER_SIZE",
    "STORE_STRUCT",
    "FLAG_VERSIONS",
    "DTYPE_CODES",
]
