"""Key-seeded initial embeddings: a row's initial value depends only on (key, seed)."""

from __future__ import annotations

import numpy as np

from .._keys import as_keys
from . import _kernels

__all__ = ["init_embeddings"]


def init_embeddings(keys, emb_dim: int, seed: int = 0, scale: float = 0.01, dtype=np.float32) -> np.ndarray:
    """Initial embeddings of ``keys`` (m,) uint64 host -> (m, emb_dim) host array of ``dtype``, each
    element ``U(-scale, scale)`` from a SplitMix64 stream of (key, seed, column). Blocking.

    Identical for a key on every rank, in every tier and in any call order (see DESIGN: "initial
    values depend only on the key"). Use ``optimizer.init_rows(init_embeddings(...))`` for full rows.
    """
    keys = as_keys(keys)
    out = np.empty((keys.shape[0], int(emb_dim)), dtype=np.float64)
    _kernels.init_embeddings(keys, np.uint64(seed), float(scale), out)
    return out.astype(dtype, copy=False)
