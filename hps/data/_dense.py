"""Transforms of the dense columns of CSV / Parquet data (``--dense-transform``).

Raw dense values go into the first layer of the model as they are: a column like an hour stamp
(~1.4e7) saturates it and the model learns nothing (AUC 0.5). The readers can transform them:

- ``none``: as they are (the default);
- ``log1p``: ``sign(x) * log1p(|x|)`` — Criteo's transform of its counts (``log1p(max(x, 0))``) for
  x >= 0, and symmetric for negative values;
- ``standardize``: ``(x - mean) / std`` per column, with the mean and standard deviation of the first
  ``SAMPLE_ROWS`` valid examples of the training data (the same rows whatever the shard or rank:
  every rank reads that sample, so all standardize alike); a constant column is only centred. The
  statistics are options of the reader (``dense_stats``): the eval data, ``hps.predict`` (through
  the export's ``model.json``) and ``hps.convert`` apply the very same ones.

``LARGE`` is the magnitude past which untransformed dense values are flagged (the trainer warns).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError

#: The transforms, by name (``--dense-transform``).
DENSE_TRANSFORMS = ("none", "log1p", "standardize")
#: Examples whose dense columns give ``standardize`` its statistics.
SAMPLE_ROWS = 1 << 16
#: |dense value| above which raw values saturate the model's first layer (warned about).
LARGE = 1e3


def check_transform(transform: str, stats, n_dense: int):
    """``stats`` as ``{"mean": [...], "std": [...]}`` of n_dense floats, or None; raises
    InvalidInputError for an unknown transform or stats of another width."""
    if transform not in DENSE_TRANSFORMS:
        raise InvalidInputError(f"dense transform must be one of {', '.join(DENSE_TRANSFORMS)}, got {transform!r}")
    if stats is None or transform != "standardize":
        return None
    mean, std = (np.asarray(stats.get(k, ()), dtype=np.float64) for k in ("mean", "std"))
    if mean.shape != (n_dense,) or std.shape != (n_dense,) or not (std > 0).all():
        raise InvalidInputError(f"dense_stats must hold a mean and a positive std for each of the {n_dense} dense "
                                f"columns, got {stats}")
    return {"mean": mean.tolist(), "std": std.tolist()}


def sample_stats(parts) -> dict:
    """``{"mean", "std"}`` (lists of float) of the dense columns of the first ``SAMPLE_ROWS`` examples of
    ``parts`` (an iterator of batches, read no further); a std of 0 becomes 1."""
    got, n = [], 0
    for b in parts:
        got.append(np.asarray(b.dense, dtype=np.float64)[: SAMPLE_ROWS - n])
        n += got[-1].shape[0]
        if n >= SAMPLE_ROWS:
            break
    if not n:
        raise InvalidInputError("--dense-transform standardize: the data has no example to take statistics from")
    x = np.concatenate(got)
    std = x.std(axis=0)
    return {"mean": x.mean(axis=0).tolist(), "std": np.where(std > 0, std, 1.0).tolist()}


def apply(dense: np.ndarray, transform: str, stats) -> np.ndarray:
    """``dense`` (n, D) float32 transformed (a new float32 array; ``none``: ``dense`` itself)."""
    if transform == "none" or dense.shape[1] == 0:
        return dense
    if transform == "log1p":
        return np.copysign(np.log1p(np.abs(dense)), dense).astype(np.float32, copy=False)
    mean = np.asarray(stats["mean"], dtype=np.float64)  # (in float64: a float32 mean of 1.4e7 is off by 0.5)
    std = np.asarray(stats["std"], dtype=np.float64)
    return ((dense.astype(np.float64) - mean) / std).astype(np.float32)
