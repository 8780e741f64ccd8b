"""Typed errors of hps.

Every error raised on purpose by hps derives from :class:`HpsError`, so a caller can catch the
whole family at once. Input errors also derive from the matching builtin (``ValueError``,
``TypeError``) so generic code that expects those keeps working.
"""

from __future__ import annotations

__all__ = [
    "HpsError",
    "InvalidInputError",
    "InvalidTypeError",
    "HashTableFullError",
    "CacheBudgetError",
    "StoreError",
    "StoreFormatError",
    "StoreLockedError",
    "CorruptionError",
    "DiskFullError",
    "DeviceUnavailableError",
    "CommError",
    "PipelineError",
    "NumericalError",
    "InternalError",
]


class HpsError(Exception):
    """Base class of every error hps raises on purpose."""


class InvalidInputError(HpsError, ValueError):
    """An argument has the wrong value or shape (e.g. the sentinel key, a ragged array)."""


class InvalidTypeError(HpsError, TypeError):
    """An argument has the wrong type or dtype."""


class HashTableFullError(HpsError):
    """A hash table cannot take the new keys of a call; the table is left exactly as before it."""


class CacheBudgetError(HpsError):
    """The pinned working set alone exceeds the DRAM cache budget."""


class StoreError(HpsError):
    """Base class of SSD-PS (parameter store) errors."""


class StoreFormatError(StoreError):
    """A path is not a store, or the store's dim/dtype/version do not match what was asked for."""


class StoreLockedError(StoreError):
    """A store, or a job's SSD-PS directory, is held by another process (its lock is taken)."""


class CorruptionError(StoreError):
    """Bytes of an acknowledged parameter file, or of a checkpoint file, do not match their checksum."""


class DiskFullError(StoreError, OSError):
    """The device ran out of space (ENOSPC); everything acknowledged before stays readable."""


class DeviceUnavailableError(HpsError, RuntimeError):
    """``device="cuda"`` was asked for but no usable GPU (or CUDA toolkit) is present."""


class CommError(HpsError, RuntimeError):
    """A collective failed, or a peer rank failed or died."""


class PipelineError(HpsError, RuntimeError):
    """A stage of the training pipeline failed; ``stage`` names it and ``__cause__`` is its error."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"pipeline stage {stage!r} failed: {message}")
        self.stage = stage


class NumericalError(HpsError, ArithmeticError):
    """Training produced a NaN or infinite loss."""


class InternalError(HpsError, RuntimeError):
    """An invariant of hps itself does not hold (a bug in hps, not in the caller's input or data)."""
