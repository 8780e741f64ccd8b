"""OP+OSRP — one permutation + one sign random projection (Zhao et al., MLSys 2020, §2): the hashing
baseline that shrinks a CTR model to ``2 k`` binary features, at a cost in AUC.

For binary data of dimension p (here: every 64-bit key), per example:

1. permute the p columns once, with a seeded 2U hash ``pos = (a x + b) mod M`` (M = 2^61 - 1, a
   bijection of [0, M); x = key mod M);
2. break the permuted columns uniformly into k bins: ``bin = pos // ceil(M / k)``;
3. in every bin, a random projection ``z = sum_i x_i r_i`` with ``r_i = +-1`` from the lowest bit
   of a seeded 4U hash (degree-3 polynomial mod M) of the column (x_i = the feature's weight, 1
   for binary data);
4. expand the sign of z into two bits: ``[0 1]`` if z > 0, ``[1 0]`` if z < 0, ``[0 0]`` if z = 0 —
   an empty bin gives ``[0 0]``. The hashed example is binary in 2 k dimensions.

:func:`op_osrp` returns the active bits: feature ``2 b + 1`` for z > 0 and ``2 b`` for z < 0. The
coefficients depend only on the seed (:func:`coefficients`), so every rank and process hashes alike.

In the trainer (``--op-osrp BINS``) every parsed batch, training and eval, is hashed before it
enters the pipeline (:class:`HashedReader`): a hashed feature ``f`` of bin ``b`` becomes the key
``hashed_key(field, f)`` of field ``b * n_fields // k`` (the bins are cut into the data's number of
fields, so the same model trains on them; pooled per field), with weight 1. At most 2 k distinct keys
exist: the model's size.
"""

from __future__ import annotations

import numpy as np

from .._hashing import mix64
from ..errors import InvalidInputError
from ._batch import FIELD_SHIFT, Batch
from ._oposrp_kernels import op_osrp_kernel

#: The Mersenne prime of the hashes' arithmetic.
MERSENNE61 = (1 << 61) - 1
#: Salts of the coefficient streams drawn from the seed. They decide which columns share a bin and
#: their signs: never renumber (a saved model would no longer match its hashed data).
PERM_SALT = 0x0F05_2015_0AA5_0001
SIGN_SALT = 0x0F05_2015_0AA5_0002
#: Most bins: hashed features 2 b + 1 must fit below a key's field bits.
MAX_BINS = 1 << (FIELD_SHIFT - 1)


def coefficients(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(perm (2,) uint64 = (a, b) with a != 0, sign (4,) uint64 = c0..c3), all in [0, M), drawn from
    ``seed`` (an integer in [0, 2^64)) by SplitMix64: the same on every machine."""
    def draw(salt, i):
        return int(mix64(np.uint64((int(seed) ^ salt) & 0xFFFFFFFFFFFFFFFF) + np.uint64(i))) % MERSENNE61

    perm = np.array([draw(PERM_SALT, 0) or 1, draw(PERM_SALT, 1)], np.uint64)
    sign = np.array([draw(SIGN_SALT, i) for i in range(4)], np.uint64)
    return perm, sign


def op_osrp(keys, offsets, bins: int, seed: int, weights=None) -> tuple[np.ndarray, np.ndarray]:
    """OP+OSRP of a CSR block of examples (module docstring) with the coefficients of ``seed``.

    keys (nnz,) uint64 (int64 reinterpreted), offsets (n + 1,) int64 with offsets[0] = 0, weights
    (nnz,) float32 or None (binary: all 1); bins: k in [1, MAX_BINS]; seed: the hash seed. Returns
    (features (m,) int64 in [0, 2 k): each example's active bits in ascending bin order, offsets
    (n + 1,) int64). Host arrays; blocking."""
    return project(keys, offsets, bins, *coefficients(seed), weights=weights)


def project(keys, offsets, bins: int, perm, sign, weights=None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`op_osrp` with explicit coefficients: perm (a, b), sign (c0, c1, c2, c3), each in
    [0, M) (a != 0)."""
    bins = int(bins)
    if not 1 <= bins <= MAX_BINS:
        raise InvalidInputError(f"op-osrp bins must lie in [1, 2^{FIELD_SHIFT - 1}], got {bins}")
    perm, sign = np.asarray(perm, np.uint64), np.asarray(sign, np.uint64)
    if perm.shape != (2,) or sign.shape != (4,) or (perm >= MERSENNE61).any() or (sign >= MERSENNE61).any() \
            or perm[0] == 0:
        raise InvalidInputError("perm must be (a, b) and sign (c0..c3), each below 2^61 - 1, with a != 0")
    keys = np.asarray(keys)
    keys = np.ascontiguousarray(keys).view(np.uint64) if keys.dtype == np.int64 else \
        np.ascontiguousarray(keys, dtype=np.uint64)
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    if offsets.ndim != 1 or offsets.shape[0] < 1 or offsets[0] != 0 or offsets[-1] != keys.shape[0] \
            or (np.diff(offsets) < 0).any():
        raise InvalidInputError(f"offsets must rise from 0 to len(keys) = {keys.shape[0]}")
    w = np.ones(keys.shape[0], np.float32) if weights is None else np.ascontiguousarray(weights, np.float32)
    if w.shape != keys.shape:
        raise InvalidInputError(f"weights {w.shape} and keys {keys.shape} differ in shape")
    widest = int(np.diff(offsets).max()) if offsets.shape[0] > 1 else 0
    out = np.empty(keys.shape[0], np.int64)
    out_off = np.empty(offsets.shape[0], np.int64)
    m = op_osrp_kernel(keys, w, offsets, bins, perm, sign, out, out_off,
                       np.empty(widest, np.int64), np.empty(widest, np.float64))
    return out[:m], out_off


def hashed_key(field: np.ndarray, feature: np.ndarray) -> np.ndarray:
    """Key of hashed ``feature`` (int64, < 2^48) in ``field``: ``field << FIELD_SHIFT | feature``
    (distinct features give distinct keys; never the sentinel: field ids stop below all ones)."""
    return (field.astype(np.uint64) << np.uint64(FIELD_SHIFT)) | feature.astype(np.uint64)


def hash_batch(batch: Batch, bins: int, seed: int) -> Batch:
    """``batch`` with its sparse features replaced by their OP+OSRP features (module docstring);
    labels and dense features unchanged, n_fields kept."""
    feat, offsets = op_osrp(batch.keys, batch.offsets, bins, seed, batch.weights)
    field = ((feat // 2) * batch.n_fields // bins).astype(np.int32)
    return Batch(batch.labels, batch.dense, hashed_key(field, feat), field, np.ones(feat.shape[0], np.float32),
                 offsets, batch.n_fields)


class HashedReader:
    """A dataset (``hps.data.open_dataset``'s) whose batches come hashed by :func:`hash_batch`;
    everything else is the wrapped dataset's. Not thread-safe, like the readers."""

    def __init__(self, dataset, bins: int, seed: int):
        if not 1 <= int(bins) <= MAX_BINS:
            raise InvalidInputError(f"--op-osrp must lie in [1, 2^{FIELD_SHIFT - 1}], got {bins}")
        self._d, self.bins, self.seed = dataset, int(bins), int(seed)

    def batches(self, start_batch: int = 0):
        for b in self._d.batches(start_batch):
            yield hash_batch(b, self.bins, self.seed)

    def eval_batches(self):
        for b in self._d.eval_batches():
            yield hash_batch(b, self.bins, self.seed)

    def __getattr__(self, name):  # only for names this class lacks
        return getattr(self.__dict__["_d"], name)  # __dict__: no recursion before _d is set
