"""``RowInitializer``: the deterministic per-key initial value of a parameter row."""

from __future__ import annotations

import numpy as np

from .._keys import as_keys
from ..errors import InvalidInputError
from ._init_kernels import in_row_order, init_rows

#: Rows of ``out`` per bucket when :meth:`RowInitializer.fill` writes rows in ascending order of their
#: place (256 rows of 256 B: 64 KiB), and the fewest rows of ``out`` for which it does.
ORDER_BUCKET_ROWS = 1 << 8
ORDER_MIN_ROWS = 1 << 16


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
        order; at (n,) int64, rows of ``out`` in [0, m)) -> ``out``. The rows are written in ascending
        order of their place when ``out`` is large (:func:`_in_row_order`)."""
        k = as_keys(keys)
        at = np.ascontiguousarray(at, dtype=np.int64)
        if at.shape != k.shape or out.shape[1:] != (self.row_width,) or out.dtype != np.float32:
            raise InvalidInputError(f"fill needs at of shape {k.shape} and out of (m, {self.row_width}) "
                                    f"float32; got at {at.shape}, out {out.shape} {out.dtype}")
        if k.shape[0] and (at.min() < 0 or at.max() >= out.shape[0]):
            raise InvalidInputError(f"fill needs rows at in [0, {out.shape[0]}), got "
                                    f"{int(at.min())}..{int(at.max())}")
        if k.shape[0]:
            k, at = _in_row_order(k, at, out.shape[0])
            init_rows(k, at, np.uint64(self.seed), self.emb_dim, self.scale, np.float32(self.state_value), out)
        return out

    def __repr__(self) -> str:
        return (f"RowInitializer(emb_dim={self.emb_dim}, row_width={self.row_width}, seed={self.seed}, "
                f"scale={self.scale}, state_value={self.state_value})")


def _in_row_order(keys, at, m: int):
    """(keys, at) with the rows ``at`` of an ``out`` of ``m`` rows in ascending buckets of
    ``ORDER_BUCKET_ROWS`` rows (a stable counting sort: ``in_row_order``; REQUIRES ``at`` in [0, m)),
    so that a fill into a large array at scattered rows (the CPU twin's slot array and the slots its
    keys claimed) writes it front to back, not a row on one page and the next on another: on the
    shared 2-core VM, 450 k rows of 256 B into a 2 GiB array took 30-45 ns a row so, sort included,
    against 60-70 at random (rows prefetched ahead, ``init_rows``) and 85-100 before either. Small
    arrays, a single row and rows in bucket order already are left as they are. A row's values
    depend on its key alone, so the order changes no value."""
    n = at.shape[0]
    if m < ORDER_MIN_ROWS or n < 2:
        return keys, at
    shift = ORDER_BUCKET_ROWS.bit_length() - 1
    skeys, sat = np.empty_like(keys), np.empty_like(at)
    if not in_row_order(keys, at, shift, np.zeros((m >> shift) + 2, np.int64), skeys, sat):
        return keys, at
    return skeys, sat


def warm_up() -> None:
    """Compile (or load from Numba's cache) ``in_row_order``, which a training job's scratch warm-up
    (``hps/train/_warmup.py``) on tiny batches does not reach (its arrays are below
    ``ORDER_MIN_ROWS``) and the real job's CPU twin does: the types of :meth:`RowInitializer.fill`'s
    call, on two rows already in order (nothing is written)."""
    _in_row_order(np.zeros(2, np.uint64), np.array([0, 1], np.int64), ORDER_MIN_ROWS)
