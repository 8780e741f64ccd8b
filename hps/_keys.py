"""Validation of key arrays (host side). Keys are uint64; the all-ones key is reserved."""

from __future__ import annotations

import numpy as np

from .errors import InvalidInputError, InvalidTypeError

#: The empty-slot sentinel of every hash table and index: 2**64 - 1 (-1 as int64). Never a valid key.
EMPTY_KEY = np.uint64(0xFFFFFFFFFFFFFFFF)


def key_array(keys, name: str = "keys") -> np.ndarray:
    """Return ``keys`` as a 1-D C-contiguous uint64 host array, reinterpreting int64 bitwise; every
    uint64 is a key (:func:`as_keys` also refuses the table's sentinel).

    Raises InvalidTypeError for other dtypes (an empty array of any dtype is accepted), InvalidInputError
    for a wrong shape.
    """
    arr = np.asarray(keys)
    if arr.ndim != 1:
        raise InvalidInputError(f"{name} must be 1-D (n,), got shape {arr.shape}")
    if arr.dtype == np.int64:
        arr = arr.view(np.uint64)
    elif arr.dtype != np.uint64:
        if arr.size == 0:
            return np.empty(0, dtype=np.uint64)
        raise InvalidTypeError(f"{name} must be uint64 (or int64, reinterpreted bitwise), got {arr.dtype}")
    return np.ascontiguousarray(arr)


def as_keys(keys, name: str = "keys") -> np.ndarray:
    """:func:`key_array`, refusing the sentinel key (InvalidInputError): the keys of a hash table."""
    arr = key_array(keys, name)
    if arr.size and (arr == EMPTY_KEY).any():
        raise InvalidInputError(
            f"{name} contains the reserved sentinel key 2**64-1 (-1 as int64), which marks empty slots; "
            "remap it before calling"
        )
    return arr


def check_rows(rows, n: int, dim: int, dtype, name: str = "values") -> np.ndarray:
    """Return ``rows`` as a C-contiguous (n, dim) host array of ``dtype``; raise on a wrong shape/dtype.

    Other numeric dtypes (float, int, bool) are cast with ``astype`` (float64 rounds to float32);
    non-numeric inputs are rejected.
    """
    arr = np.asarray(rows)
    if arr.shape != (n, dim):
        raise InvalidInputError(f"{name} must have shape ({n}, {dim}) to match the keys and dim, got {arr.shape}")
    if arr.dtype != dtype:
        if arr.dtype.kind not in "fiub":
            raise InvalidTypeError(f"{name} must be numeric ({np.dtype(dtype)}), got {arr.dtype}")
        arr = arr.astype(dtype)
    return np.ascontiguousarray(arr)


def rows_at(out, at, n: int, dim: int, dtype):
    """Validated ``(out, at)`` of a call that writes the rows of n keys into ``out[at[i]]``: ``out`` a
    writable C-contiguous (m, dim) host array of ``dtype`` (None: a new (n, dim) one), ``at`` (n,) int64
    rows of it (None: 0..n-1). Raises InvalidInputError (InvalidTypeError for a wrong dtype) naming
    what is wrong; a row outside ``out`` is refused (the kernels do not check bounds)."""
    if out is None:
        out = np.empty((n, dim), dtype=dtype)
    elif not isinstance(out, np.ndarray) or out.dtype != dtype:
        raise InvalidTypeError(f"out must be a NumPy array of {np.dtype(dtype)}, got {type(out).__name__} "
                               f"{getattr(out, 'dtype', '')}")
    elif out.ndim != 2 or out.shape[1] != dim or not (out.flags.c_contiguous and out.flags.writeable):
        raise InvalidInputError(f"out must be a writable C-contiguous (m, {dim}) array, got {out.shape}")
    if at is None:
        return out, np.arange(n, dtype=np.int64)
    at = np.ascontiguousarray(at, dtype=np.int64)
    if at.shape != (n,) or (n and (int(at.min()) < 0 or int(at.max()) >= out.shape[0])):
        raise InvalidInputError(f"at must be ({n},) int64 rows of out (0 <= at < {out.shape[0]}), got shape "
                                f"{at.shape}")
    return out, at


def packed(a: np.ndarray) -> np.ndarray:
    """``a`` with C strides (a copy when NumPy calls it contiguous with other strides, e.g. a
    broadcast (n, 1) column), as a copy into a device buffer needs."""
    want = a.itemsize * np.cumprod((a.shape[1:] + (1,))[::-1])[::-1]
    return a if tuple(want) == a.strides else a.copy(order="C")
