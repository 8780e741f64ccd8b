"""``Batch``: the unit every pipeline stage passes on — a CSR block of examples.

Array contract (host NumPy arrays):

- ``labels`` (n,) float32 in {0, 1}
- ``dense`` (n, n_dense) float32 (``n_dense`` may be 0)
- ``keys`` (nnz,) uint64: feature keys, ``make_keys(field, value)``
- ``field`` (nnz,) int32: the field of each key, in [0, n_fields)
- ``weights`` (nnz,) float32: the feature value multiplying its embedding (1 for categoricals)
- ``offsets`` (n + 1,) int64: keys of example i are ``keys[offsets[i]:offsets[i + 1]]``

``FixedBatch`` is the same examples when each has exactly one key per field and weight 1 (every format
but libsvm): ``labels``, ``dense`` and ``keys`` (n, F) only. The readers cut and join those (less to
copy) and make the ``Batch`` of each batch they yield with ``FixedBatch.batch()``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._hashing import mix64
from .._jit import njit
from ..errors import InvalidInputError

#: Bits of a key below the field id: key = field << FIELD_SHIFT | (mix64(value) >> (64 - FIELD_SHIFT)).
#: Written to disk inside every key: never change.
FIELD_SHIFT = 48
#: Version of how the readers turn a feature into its key: ``make_keys`` (FIELD_SHIFT, SplitMix64),
#: FNV-1a of CSV/Parquet text, Criteo's hex values and log2 buckets, MISSING_VALUE / NEGATIVE_VALUE,
#: libsvm's positional fields. Data converted by ``hps.convert`` records it: bump it with any change
#: that gives a feature another key.
HASHING_VERSION = 1
#: Largest field id (all-ones field with an all-ones hash would be the sentinel key).
MAX_FIELD = (1 << (64 - FIELD_SHIFT)) - 2
#: Most fields a dataset may have (ids 0..MAX_FIELD).
MAX_FIELDS = MAX_FIELD + 1


def check_n_fields(n_fields: int, what: str, low: int = 1) -> int:
    """``n_fields`` as an int in [low, MAX_FIELDS]; ``what`` names its source in the error."""
    n = int(n_fields)
    if not low <= n <= MAX_FIELDS:
        raise InvalidInputError(f"{what} must be between {low} and {MAX_FIELDS} (field ids are "
                                f"{64 - FIELD_SHIFT}-bit inside keys), got {n}")
    return n


@njit(nogil=True, cache=True)
def _make_keys(field, values, shift, max_field, out):
    """Fills out (nnz,) uint64; returns how many ``field`` ids lie outside [0, max_field]."""
    low = np.uint64(64) - np.uint64(shift)
    n_bad = 0
    for i in range(values.shape[0]):
        f = field[i]
        if f < 0 or f > max_field:
            n_bad += 1
        out[i] = (np.uint64(f) << np.uint64(shift)) | (mix64(values[i]) >> low)
    return n_bad


def make_keys(field: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Keys of feature ``values`` (nnz,) uint64 in fields ``field`` (nnz,) int; field id in the high bits.

    Raises ``InvalidInputError`` when a field id is outside [0, MAX_FIELD] (it would not fit its bits)."""
    field = np.ascontiguousarray(field, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.uint64)
    if field.shape != values.shape:
        raise InvalidInputError(f"field {field.shape} and values {values.shape} differ in shape")
    out = np.empty(values.shape[0], dtype=np.uint64)
    if _make_keys(field, values, FIELD_SHIFT, MAX_FIELD, out):
        raise InvalidInputError(f"field ids must lie in [0, {MAX_FIELD}], got {int(field.min())}.."
                                f"{int(field.max())}")
    return out


@dataclass
class Batch:
    labels: np.ndarray
    dense: np.ndarray
    keys: np.ndarray
    field: np.ndarray
    weights: np.ndarray
    offsets: np.ndarray
    n_fields: int

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def example(self) -> np.ndarray:
        """(nnz,) int32: the example (row in this batch) of each key."""
        return np.repeat(np.arange(len(self), dtype=np.int32), np.diff(self.offsets))

    def slice(self, start: int, stop: int) -> "Batch":
        """Examples [start, stop) as a new Batch (views where possible)."""
        a, b = int(self.offsets[start]), int(self.offsets[stop])
        return Batch(self.labels[start:stop], self.dense[start:stop], self.keys[a:b],
                     self.field[a:b], self.weights[a:b], self.offsets[start:stop + 1] - a,
                     self.n_fields)

    @staticmethod
    def concat(parts: list["Batch"]) -> "Batch":
        """Examples of ``parts`` in order, as one Batch."""
        if len(parts) == 1:
            return parts[0]
        sizes = np.array([p.offsets[-1] for p in parts], dtype=np.int64)
        shift = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        offsets = np.concatenate([[0]] + [p.offsets[1:] + s for p, s in zip(parts, shift)])
        return Batch(np.concatenate([p.labels for p in parts]), np.concatenate([p.dense for p in parts]),
                     np.concatenate([p.keys for p in parts]), np.concatenate([p.field for p in parts]),
                     np.concatenate([p.weights for p in parts]), offsets.astype(np.int64),
                     parts[0].n_fields)


@dataclass
class FixedBatch:
    """Examples with one key per field, in field order, all of weight 1: ``labels`` (n,) float32,
    ``dense`` (n, D) float32, ``keys`` (n, F) uint64 (row-major: example i's keys are ``keys[i]``)."""

    labels: np.ndarray
    dense: np.ndarray
    keys: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def slice(self, start: int, stop: int) -> "FixedBatch":
        """Examples [start, stop) (views)."""
        return FixedBatch(self.labels[start:stop], self.dense[start:stop], self.keys[start:stop])

    @staticmethod
    def concat(parts: list["FixedBatch"]) -> "FixedBatch":
        """Examples of ``parts`` in order (one copy; the part itself when there is one)."""
        if len(parts) == 1:
            return parts[0]
        return FixedBatch(np.concatenate([p.labels for p in parts]), np.concatenate([p.dense for p in parts]),
                          np.concatenate([p.keys for p in parts]))

    def batch(self) -> Batch:
        """The :class:`Batch` of these examples (``keys`` flattened: a view when contiguous). Its
        ``field`` and ``weights`` depend on the shape alone: they are views of arrays shared by every
        batch of as many fields (:func:`_fixed_columns`), which no consumer writes."""
        n, n_fields = self.keys.shape
        field, weights = _fixed_columns(n, n_fields)
        return Batch(self.labels, self.dense, np.ascontiguousarray(self.keys).reshape(-1), field, weights,
                     np.arange(n + 1, dtype=np.int64) * n_fields, n_fields)


#: n_fields -> (field (m * n_fields,) int32 = 0, 1, .., n_fields - 1 repeated, weights (m * n_fields,)
#: float32 ones) of the most examples asked so far: what ``FixedBatch.batch`` hands out views of.
_FIXED_COLUMNS: dict = {}


def _fixed_columns(n: int, n_fields: int) -> tuple[np.ndarray, np.ndarray]:
    """(field, weights) of ``n`` examples of ``n_fields`` fixed fields: views of the kept arrays, made
    (or grown) only when a batch is larger than any before. A batch's two columns were 8 B a key of
    fresh memory, filled and faulted in at every batch (~8-10 ms of a 65,536 x 26 synthetic batch's
    ~60 on the 2-core VM, ``python -m bench.bench_host``); they never change, so batches share them.
    Thread-safe: readers racing on a new size each make equal arrays, and a published array is never
    written again."""
    field, weights = _FIXED_COLUMNS.get(n_fields, (None, None))
    if field is None or field.shape[0] < n * n_fields:
        field = np.tile(np.arange(n_fields, dtype=np.int32), n)
        weights = np.ones(n * n_fields, dtype=np.float32)
        _FIXED_COLUMNS[n_fields] = field, weights
    return field[:n * n_fields], weights[:n * n_fields]
