"""hps: a hierarchical (GPU HBM / DRAM / SSD) parameter server for CTR embedding models.

Public API (everything a user needs is importable from here)::

    from hps import HashTable, HashTableFullError, HpsError     # the table and the errors
    from hps import PartitionedHashTable, SSDStore, MemPS      # tiers

Everything but the errors is imported on first use: ``import hps`` (and so ``python -m hps.train``, whose
``__main__`` runs once its package is imported) loads neither NumPy nor Numba.
    from hps import load_export                                # read a trained model back
    from hps import Predictor                                  # score raw data with an export

Subpackages: ``hps.gpu`` (HBM-PS), ``hps.mem`` (MEM-PS), ``hps.ssd`` (SSD-PS), ``hps.comm`` (MPI),
``hps.data`` (readers), ``hps.model`` (models: ctr, wdl, deepfm, dcn, dlrm; optimizers), ``hps.train``
(the job), ``hps.predict`` (scoring).
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


def __getattr__(name):
    """Import the table, the tiers and the trainer only when asked for: ``import hps`` stays light."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'hps' has no attribute {name!r}")

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
