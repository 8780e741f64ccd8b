"""Data readers (Criteo TSV, libsvm/libFM, CSV) and the synthetic generator; all yield ``Batch``es."""

from ._batch import FIELD_SHIFT, Batch, make_keys

__all__ = ["Batch", "make_keys", "FIELD_SHIFT"]
