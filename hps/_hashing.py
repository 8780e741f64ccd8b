"""Key hashing shared by every tier: slot hashing, key -> part and key -> node partition policies.

Kernels here are pure ``@njit`` functions; everything they need is an argument.

Partition policy (documented, stable): the owner of ``key`` among ``n`` parts is
``mix64(key ^ salt) % n``, where ``mix64`` is the SplitMix64 finaliser. Different salts give
independent policies, so the GPU part of a key does not correlate with its node or its slot.
"""

from __future__ import annotations

import numpy as np

from ._jit import njit

#: Salt of the key -> node (MPI rank) policy. Changing it changes which rank owns which key.
NODE_SALT = np.uint64(0x5BD1E9955BD1E995)
#: Salt of the key -> GPU part policy (Algorithm 2's partition policy).
PART_SALT = np.uint64(0x9E3779B97F4A7C15)


@njit(nogil=True, cache=True, inline="always")
def mix64(x):
    """SplitMix64 finaliser of a uint64 (a bijection with good avalanche)."""
    x = np.uint64(x)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


@njit(nogil=True, cache=True)
def _owner_kernel(keys, n, salt, out):
    nn = np.uint64(n)
    for i in range(keys.shape[0]):
        out[i] = np.int32(mix64(keys[i] ^ salt) % nn)


def owner_of(keys: np.ndarray, n: int, salt: np.uint64 = NODE_SALT) -> np.ndarray:
    """Owner (0..n-1) of each key. keys (m,) uint64 host -> (m,) int32 host. Blocking."""
    out = np.empty(keys.shape[0], dtype=np.int32)
    if n == 1:
        out[:] = 0
        return out
    _owner_kernel(keys, n, salt, out)
    return out


@njit(nogil=True, cache=True)
def group_by_owner(owner, n):
    """Counting sort by owner: returns (order, offsets) with ``keys[order[offsets[p]:offsets[p+1]]]``
    the keys of part ``p`` in input order. owner (m,) int32 -> order (m,) int64, offsets (n+1,) int64."""
    counts = np.zeros(n + 1, dtype=np.int64)
    for i in range(owner.shape[0]):
        counts[owner[i] + 1] += 1
    for p in range(n):
        counts[p + 1] += counts[p]
    offsets = counts.copy()
    pos = counts[:n].copy()
    order = np.empty(owner.shape[0], dtype=np.int64)
    for i in range(owner.shape[0]):
        p = owner[i]
        order[pos[p]] = i
        pos[p] += 1
    return order, offsets
