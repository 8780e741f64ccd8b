"""hps: a hierarchical (GPU HBM / DRAM / SSD) parameter server for CTR embedding models.

Public API (everything a user needs is importable from here)::

    from hps import HashTable, HashTableFullError, HpsError     # the table and the errors
    from hps import PartitionedHashTable, SSDStore, MemPS      # tiers
    from hps import load_export                                # read a trained model back
    from hps import Predictor                                  # score raw data with an export

Subpackages: ``hps.gpu`` (HBM-PS), ``hps.mem`` (MEM-PS), ``hps.ssd`` (SSD-PS), ``hps.comm`` (MPI),
``hps.data`` (readers), ``hps.model`` (models: ctr, wdl, deepfm, dcn, dlrm; optimizers), ``hps.train``
(the job), ``hps.predict`` (scoring).

Everything but the errors is imported on first use (``hps.HashTable``, ``hps.mem``, ...): ``import hps``
(and so ``python -m hps.train``, whose ``__main__`` runs once its package is imported) loads neither
NumPy nor Numba.
"""

from .errors import (
    CacheBudgetError,
    CommError,
    CorruptionError,
    DeviceUnavailableError,
    DiskFullError,
    HashTableFullError,
    HpsError,
    InternalError,
    InvalidInputError,
    InvalidTypeError,
    NumericalError,
    PipelineError,
    StoreError,
    StoreFormatError,
    StoreLockedError,
)

__version__ = "0.1.0"

_LAZY = {
    "HashTable": ("hps.table", "HashTable"),
    "PartitionedHashTable": ("hps.gpu", "PartitionedHashTable"),
    "SSDStore": ("hps.ssd", "SSDStore"),
    "MemPS": ("hps.mem", "MemPS"),
    "load_export": ("hps.formats", "load_export"),
    "Predictor": ("hps.predict", "Predictor"),
}


#: Subpackages ``hps.<name>`` resolves on first use, as they resolved when ``import hps`` loaded them.
_SUBPACKAGES = ("cli", "comm", "convert", "data", "formats", "gpu", "mem", "model", "predict", "profile", "ssd",
                "table", "train")


def __getattr__(name):
    """Import the table, the tiers and the subpackages only when asked for: ``import hps`` stays light."""
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'hps' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_SUBPACKAGES))

__all__ = [
    "HashTable",
    "PartitionedHashTable",
    "SSDStore",
    "MemPS",
    "load_export",
    "Predictor",
    "HpsError",
    "HashTableFullError",
    "InvalidInputError",
    "InvalidTypeError",
    "CacheBudgetError",
    "StoreError",
    "StoreLockedError",
    "StoreFormatError",
    "CorruptionError",
    "DiskFullError",
    "DeviceUnavailableError",
    "CommError",
    "PipelineError",
    "NumericalError",
    "InternalError",
]
