"""Key-seeded initial embeddings: a row's initial value depends only on (key, seed)."""

from __future__ import annotations

import numpy as np

from ..mem import RowInitializer

__all__ = ["init_embeddings"]


def init_embeddings(keys, emb_dim: int, seed: int = 0, scale: float = 0.01, dtype=np.float32) -> np.ndarray:
    """Initial embeddings of ``keys`` (m,) uint64 host -> (m, emb_dim) host array of ``dtype``.

    The embedding columns of :class:`hps.mem.RowInitializer` (the one initializer every tier uses):
    identical for a key on every rank, in every tier and in any call order. Blocking.
    """
    return RowInitializer(int(emb_dim), int(emb_dim), seed, scale)(keys).astype(dtype, copy=False)
