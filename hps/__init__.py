"""hps: a hierarchical (GPU HBM / DRAM / SSD) parameter server for CTR embedding models.

Public API (everything a user needs is importable from here)::

    from hps import HashTable, HashTableFullError, HpsError
"""

from .errors import (
    CacheBudgetError,
    CommError,
    CorruptionError,
    DeviceUnavailableError,
    DiskFullError,
    HashTableFullError,
    HpsError,
    InvalidInputError,
    InvalidTypeError,
    NumericalError,
    PipelineError,
    StoreError,
    StoreFormatError,
)
from .table import HashTable

__version__ = "0.1.0"

__all__ = [
    "HashTable",
    "HpsError",
    "HashTableFullError",
    "InvalidInputError",
    "InvalidTypeError",
    "CacheBudgetError",
    "StoreError",
    "StoreFormatError",
    "CorruptionError",
    "DiskFullError",
    "DeviceUnavailableError",
    "CommError",
    "PipelineError",
    "NumericalError",
]
