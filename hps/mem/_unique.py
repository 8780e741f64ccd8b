"""The host's dedup of key arrays: ``unique_counts``, ``unique_keys`` and ``unique_segments`` (hashing,
not sorting; first-occurrence order), their validation and their sizing (``unique_bytes``). The
kernels are ``_map_kernels._unique_counts`` and ``_unique_segments``.

Every uint64, the all-ones key included, is a key here (the tables hold indices into the distinct
keys, so no key value is a sentinel): these functions do not call ``hps._keys.as_keys``, which
refuses that key. int64 keys are read as uint64 bitwise (a view, no copy).
"""

from __future__ import annotations

import numpy as np

from .._keys import key_array
from ..errors import InvalidInputError, InvalidTypeError
from ._map_kernels import _unique_counts, _unique_segments


def _cells(longest: int) -> int:
    """Cells of the probing table for ``longest`` keys at a time: a power of two >= 16 and >= 2 x longest."""
    m = 16
    while m < 2 * longest:
        m *= 2
    return m


def _cell_dtype(n: int):
    """The dtype of a table cell indexing ``n`` keys (4 bytes while it can)."""
    return np.int32 if n < 2 ** 31 else np.int64


def _table(n: int, longest: int) -> np.ndarray:
    """A free probing table (-1 filled) for ``longest`` keys at a time, its cells able to index ``n`` keys."""
    return np.full(_cells(longest), -1, dtype=_cell_dtype(n))


def unique_bytes(n: int, longest: int | None = None) -> int:
    """Bytes a call holds at its peak on ``n`` keys: ``unique_counts`` (``longest`` None: its table is
    sized by all n keys; uniq, counts and inverse 8 B a key each) or ``unique_segments`` with segments of
    at most ``longest`` keys (its table sized by the longest segment, ``cells`` 8 B each; uniq and
    inverse 8 B a key). The P + 1 ``ubounds`` are not counted."""
    n = int(n)
    if longest is None:
        return _cells(n) * np.dtype(_cell_dtype(n)).itemsize + 24 * n
    longest = int(longest)
    return _cells(longest) * np.dtype(_cell_dtype(n)).itemsize + 8 * longest + 16 * n


def unique_counts(keys):
    """Distinct keys in first-occurrence order with their counts and the inverse map.
    keys (n,) uint64 (or int64, read bitwise) host -> uniq (u,) uint64, counts (u,) int64, inverse (n,)
    int64 (``uniq[inverse] == keys``). Blocking; thread-safe (its arrays are its own); any uint64 is a
    key. Raises InvalidInputError / InvalidTypeError for keys not 1-D uint64."""
    keys = key_array(keys, "unique_counts keys")
    n = keys.shape[0]
    uniq = np.empty(n, dtype=np.uint64)
    counts = np.zeros(n, dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    u = _unique_counts(keys, _table(n, n), uniq, counts, inverse)
    return uniq[:u], counts[:u], inverse


def unique_keys(keys):
    """``unique_counts(keys)[0]`` (distinct keys in first-occurrence order) without the counts and the
    inverse it would write and drop. keys (n,) uint64 (or int64) host -> (u,) uint64. Blocking;
    thread-safe; raises as ``unique_counts``."""
    keys = key_array(keys, "unique_keys keys")
    n = keys.shape[0]
    uniq = np.empty(n, dtype=np.uint64)
    none = np.empty(0, dtype=np.int64)
    return uniq[:_unique_counts(keys, _table(n, n), uniq, none, none)]


def unique_segments(keys, bounds):
    """:func:`unique_counts`'s distinct keys and inverse of every segment of ``keys`` at once (a batch's
    mini-batches), in one pass and a few arrays (not a table and three arrays per segment).
    keys (n,) uint64 (or int64) host; bounds (P + 1,) integer, P >= 0, non-decreasing offsets into
    ``keys``, segment j being ``keys[bounds[j]:bounds[j + 1]]`` -> uniq (U,) uint64, ubounds (P + 1,)
    int64, inverse (bounds[P] - bounds[0],) int64: segment j's distinct keys in first-occurrence order
    are ``uniq[ubounds[j]:ubounds[j + 1]]`` and ``inverse[bounds[j] - bounds[0]:bounds[j + 1] -
    bounds[0]]`` indexes them. Blocking; thread-safe (its arrays are its own); any uint64 is a key.
    Raises InvalidInputError / InvalidTypeError for keys as ``unique_counts``, bounds not 1-D integer,
    empty, out of the keys or decreasing."""
    keys = key_array(keys, "unique_segments keys")
    bounds = np.asarray(bounds)
    if bounds.ndim != 1 or bounds.shape[0] == 0:
        raise InvalidInputError(f"unique_segments needs bounds (P + 1,) with P >= 0, got shape {bounds.shape}")
    if bounds.dtype.kind not in "iu":
        raise InvalidTypeError(f"unique_segments needs integer bounds, got {bounds.dtype}")
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    if bounds[0] < 0 or bounds[-1] > keys.shape[0] or (np.diff(bounds) < 0).any():
        raise InvalidInputError(f"unique_segments needs {bounds.shape[0]} bounds non-decreasing within "
                                f"the {keys.shape[0]} keys")
    n = int(bounds[-1] - bounds[0])
    longest = int(np.diff(bounds).max()) if bounds.shape[0] > 1 else 0
    tab = _table(n, longest)
    cells = np.empty(longest, dtype=np.uint64)
    uniq = np.empty(n, dtype=np.uint64)
    ubounds = np.zeros(bounds.shape[0], dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    if bounds.shape[0] > 1:
        uniq = uniq[:_unique_segments(keys, bounds, tab, cells, uniq, ubounds, inverse)]
    return uniq, ubounds, inverse
