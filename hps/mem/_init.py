"""``RowInitializer``: the deterministic per-key initial value of a parameter row."""

from __future__ import annotations

import numpy as np

from .._keys import as_keys
from ..errors import InvalidInputError
from ._init_kernels import init_rows


class RowInitializer:
    """Initial rows that depend only on (key, seed): the same key is born with the same values on any
    rank, in any tier, in any order (a counter-based hash, ``mix64``, per key and column).

    - ``emb_dim``: leading columns drawn uniform in [-scale, scale) (float32).
    - ``row_width``: total columns; the trailing ``row_width - emb_dim`` optimizer-state columns
      start at ``state_value``.

    ``__call__(keys (n,) uint64) -> (n, row_width) float32`` host array; blocking; thread-safe
    (stateless)."""

    def __init__(self, emb_dim: int, row_width: int, seed: int = 0, scale: float = 0.01,
                 state_value: float = 0.0):
        if not 0 <= emb_dim <= row_width or row_width < 1:
            raise InvalidInputError(f"need 0 <= emb_dim <= row_width and row_width >= 1, got "
                                    f"emb_dim={emb_dim}, row_width={row_width}")
        if not scale > 0:
            raise InvalidInputError(f"scale must be > 0, got {scale}")
        self.emb_dim = int(emb_dim)
        self.row_width = int(row_width)
        self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self.scale = float(scale)
        self.state_value = float(state_value)

    def __call__(self, keys) -> np.ndarray:
        k = as_keys(keys)
        out = np.empty((k.shape[0], self.row_width), dtype=np.float32)
        return self.fill(k, out, np.arange(k.shape[0], dtype=np.int64))

    def fill(self, keys, out, at) -> np.ndarray:
        """Write the initial row of ``keys[i]`` into ``out[at[i]]`` (out (m, row_width) float32, C
        order; at (n,) int64) -> ``out``."""
        k = as_keys(keys)
        at = np.ascontiguousarray(at, dtype=np.int64)
        if at.shape != k.shape or out.shape[1:] != (self.row_width,) or out.dtype != np.float32:
            raise InvalidInputError(f"fill needs at of shape {k.shape} and out of (m, {self.row_width}) "
                                    f"float32; got at {at.shape}, out {out.shape} {out.dtype}")
        if k.shape[0]:
            init_rows(k, at, np.uint64(self.seed), self.emb_dim, self.scale, np.float32(self.state_value), out)
        return out

    def __repr__(self) -> str:
        return (f"RowInitializer(emb_dim={self.emb_dim}, row_width={self.row_width}, seed={self.seed}, "
                f"scale={self.scale}, state_value={self.state_value})")
