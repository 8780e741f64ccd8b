"""Arguments of the library API checked where ``int()``/``float()`` would raise a builtin error (a
string, None, inf) or pass a fraction (``positive_int``, ``unit_fraction``), and allocations larger
than the machine holds raised as typed errors (``allocated``)."""

from __future__ import annotations

from .errors import HpsError, InvalidInputError


def positive_int(value, name: str) -> int:
    """``value`` as an int > 0; InvalidInputError naming ``name`` for anything else (a string, inf,
    2.5, 0, None)."""
    try:
        ok = int(value) == value and value > 0
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise InvalidInputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def unit_fraction(value, name: str) -> float:
    """``value`` as a float in (0, 1]; InvalidInputError naming ``name`` for anything else."""
    try:
        ok = 0.0 < float(value) <= 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise InvalidInputError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


def allocated(make, what: str):
    """``make()`` -> its result; an allocation larger than the machine holds (NumPy's ValueError past
    the array-size limit, MemoryError, OverflowError) raised as InvalidInputError "``what``, more than
    this machine can allocate"; hps's own errors pass as they are."""
    try:
        return make()
    except HpsError:
        raise
    except (ValueError, MemoryError, OverflowError) as e:
        raise InvalidInputError(f"{what}, more than this machine can allocate ({e})") from None
