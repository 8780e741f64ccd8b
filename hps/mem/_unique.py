"""The host's dedup of key arrays: ``unique_counts``, ``unique_keys`` and ``unique_segments`` (hashing,
not sorting; first-occurrence order), their validation and their sizing (``unique_bytes``), and
``DedupScratch``, the probing tables a caller that dedups batch after batch keeps from call to call.
The kernels are ``_map_kernels._unique_counts`` and ``_unique_segments``.

Every uint64, the all-ones key included, is a key here (the tables hold indices into the distinct
keys, so no key value is a sentinel): these functions do not call ``hps._keys.as_keys``, which
refuses that key. int64 keys are read as uint64 bitwise (a view, no copy).
"""

from __future__ import annotations

import numpy as np

from .._keys import key_array
from .._prefetch import ahead_ring
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


def _table(n: int, longest: int, scratch=None) -> np.ndarray:
    """A free probing table (-1 filled) for ``longest`` keys at a time, its cells able to index ``n`` keys:
    ``scratch``'s (a :class:`DedupScratch`), else a new one."""
    if scratch is not None:
        return scratch.table(n, longest)
    return np.full(_cells(longest), -1, dtype=_cell_dtype(n))


class DedupScratch:
    """The probing table and the cell list of :func:`unique_keys` and :func:`unique_segments`, kept
    from call to call by one caller that dedups batch after batch (the prepare stage's plans): a
    batch's table is 1-16 MiB, and a new one per call faults its pages in and fills them every time.
    The table is free (-1 filled) between calls: ``unique_segments`` frees the cells it filled,
    ``unique_keys`` refills the cells it used (a memset). It grows to the largest call and is used
    through a power-of-two prefix, so results are those of a fresh table. Not thread-safe: one owner
    thread (the calls that pass it run one at a time)."""

    def __init__(self):
        self._tab = {np.dtype(np.int32): np.empty(0, np.int32), np.dtype(np.int64): np.empty(0, np.int64)}
        self._cells = np.empty(0, np.uint64)

    def table(self, n: int, longest: int) -> np.ndarray:
        """A free table (-1 filled) for ``longest`` keys at a time, its cells able to index ``n`` keys:
        a prefix of the kept one (grown first when it is smaller)."""
        m, dt = _cells(longest), np.dtype(_cell_dtype(n))
        if self._tab[dt].shape[0] < m:
            self._tab[dt] = np.full(m, -1, dtype=dt)
        return self._tab[dt][:m]

    def cells(self, longest: int) -> np.ndarray:
        """(longest,) uint64 scratch (``_unique_segments``' cells of one segment)."""
        if self._cells.shape[0] < longest:
            self._cells = np.empty(longest, np.uint64)
        return self._cells[:longest]


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
    u = _unique_counts(keys, _table(n, n), uniq, counts, inverse, ahead_ring())
    return uniq[:u], counts[:u], inverse


def unique_keys(keys, scratch: DedupScratch | None = None):
    """``unique_counts(keys)[0]`` (distinct keys in first-occurrence order) without the counts and the
    inverse it would write and drop. keys (n,) uint64 (or int64) host -> (u,) uint64. ``scratch``: the
    caller's :class:`DedupScratch` (its table is used, then refilled), else a table of this call.
    Blocking; thread-safe without ``scratch`` (with it, as the scratch); raises as ``unique_counts``."""
    keys = key_array(keys, "unique_keys keys")
    n = keys.shape[0]
    uniq = np.empty(n, dtype=np.uint64)
    none = np.empty(0, dtype=np.int64)
    tab = _table(n, n, scratch)
    u = _unique_counts(keys, tab, uniq, none, none, ahead_ring())
    if scratch is not None:
        tab.fill(-1)  # free for the next call (sequential: cheaper than probing the u keys again)
    return uniq[:u]


def unique_segments(keys, bounds, scratch: DedupScratch | None = None):
    """:func:`unique_counts`'s distinct keys and inverse of every segment of ``keys`` at once (a batch's
    mini-batches), in one pass and a few arrays (not a table and three arrays per segment).
    keys (n,) uint64 (or int64) host; bounds (P + 1,) integer, P >= 0, non-decreasing offsets into
    ``keys``, segment j being ``keys[bounds[j]:bounds[j + 1]]`` -> uniq (U,) uint64, ubounds (P + 1,)
    int64, inverse (bounds[P] - bounds[0],) int64: segment j's distinct keys in first-occurrence order
    are ``uniq[ubounds[j]:ubounds[j + 1]]`` and ``inverse[bounds[j] - bounds[0]:bounds[j + 1] -
    bounds[0]]`` indexes them. ``scratch``: the caller's :class:`DedupScratch` (its table and cells
    are used and left free), else arrays of this call. Blocking; thread-safe without ``scratch`` (with
    it, as the scratch); any uint64 is a key. Raises InvalidInputError / InvalidTypeError for keys as ``unique_counts``, bounds not 1-D integer,
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
    tab = _table(n, longest, scratch)
    cells = np.empty(longest, dtype=np.uint64) if scratch is None else scratch.cells(longest)
    uniq = np.empty(n, dtype=np.uint64)
    ubounds = np.zeros(bounds.shape[0], dtype=np.int64)
    inverse = np.empty(n, dtype=np.int64)
    if bounds.shape[0] > 1:
        uniq = uniq[:_unique_segments(keys, bounds, tab, cells, uniq, ubounds, inverse, ahead_ring())]
    return uniq, ubounds, inverse
