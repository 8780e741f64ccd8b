"""``Batch``: the unit every pipeline stage passes on — a CSR block of examples.

Array contract (host NumPy arrays):

- ``labels`` (n,) float32 in {0, 1}
- ``dense`` (n, n_dense) float32 (``n_dense`` may be 0)
- ``keys`` (nnz,) uint64: feature keys, ``make_keys(field, value)``
- ``field`` (nnz,) int32: the field of each key, in [0, n_fields)
- ``weights`` (nnz,) float32: the feature value multiplying its embedding (1 for categoricals)
- ``offsets`` (n + 1,) int64: keys of example i are ``keys[offsets[i]:offsets[i + 1]]``
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .._hashing import mix64

#: Bits of a key below the field id: key = field << FIELD_SHIFT | (mix64(value) >> (64 - FIELD_SHIFT)).
#: Written to disk inside every key: never change.
FIELD_SHIFT = 48
#: Largest field id (all-ones field with an all-ones hash would be the sentinel key).
MAX_FIELD = (1 << (64 - FIELD_SHIFT)) - 2


@njit(nogil=True, cache=True)
def _make_keys(field, values, out):
    shift = np.uint64(64 - 48)
    for i in range(values.shape[0]):
        out[i] = (np.uint64(field[i]) << np.uint64(48)) | (mix64(values[i]) >> shift)


def make_keys(field: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Keys of feature ``values`` (nnz,) uint64 in fields ``field`` (nnz,) int; field id in the high bits."""
    field = np.ascontiguousarray(field, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.uint64)
    out = np.empty(values.shape[0], dtype=np.uint64)
    _make_keys(field, values, out)
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
