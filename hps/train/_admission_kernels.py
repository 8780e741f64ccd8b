"""Kernels of feature admission (``_admission``): the count-min sketch and the key rewrite.

Pure ``@njit`` functions: everything they need is an argument (no module state).
"""

from __future__ import annotations

import numpy as np

from .._hashing import mix64
from .._jit import njit


@njit(nogil=True, cache=True)
def sketch_add(sketch, salts, keys, counts, est):
    """Conservative-update count-min sketch: add ``counts[i]`` occurrences of ``keys[i]`` and write
    the new estimate of each key into ``est[i]``.

    sketch (d, w) uint32, w a power of two; salts (d,) uint64 (one hash per row); keys (n,) uint64
    distinct; counts (n,) int64 >= 0; est (n,) int64 written. The estimate of a key is the minimum of
    its d counters; conservative update raises each of them only to that minimum plus the count
    (never above), so an estimate is never below the true count and overcounts less than the plain
    sketch. Counters saturate at 2**32 - 1. Returns the occurrences added."""
    d, w = sketch.shape
    mask = np.uint64(w - 1)
    cap = np.int64(0xFFFFFFFF)
    added = np.int64(0)
    for i in range(keys.shape[0]):
        low = cap
        for r in range(d):
            c = np.int64(sketch[r, mix64(keys[i] ^ salts[r]) & mask])
            if c < low:
                low = c
        new = min(low + counts[i], cap)
        for r in range(d):
            j = mix64(keys[i] ^ salts[r]) & mask
            if np.int64(sketch[r, j]) < new:
                sketch[r, j] = np.uint32(new)
        est[i] = new
        added += counts[i]
    return added


@njit(nogil=True, cache=True)
def halve(sketch):
    """Halve every counter in place (ageing). sketch (d, w) uint32."""
    d, w = sketch.shape
    for r in range(d):
        for j in range(w):
            sketch[r, j] >>= np.uint32(1)


@njit(nogil=True, cache=True)
def rewrite_keys(keys, admitted, shared_mask, out):
    """``out[i] = keys[i]`` where ``admitted[i]``, else the shared key of its field
    ``keys[i] | shared_mask``. keys (n,) uint64, admitted (n,) bool, out (n,) uint64."""
    for i in range(keys.shape[0]):
        out[i] = keys[i] if admitted[i] else keys[i] | shared_mask
