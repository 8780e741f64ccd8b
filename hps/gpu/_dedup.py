"""A batch's working set computed where its keys are: ``unique_inverse`` of raw keys and the miss list
against the resident HBM-PS, on the device, so the host receives only the misses (8 bytes a key).

Both functions take the array module ``xp`` of the keys (CuPy on a GPU; NumPy on the CPU and under the
CUDA simulator), so ``--device cpu`` runs the same code on host arrays. They are library pieces driven
from a batch-level host call (the place stage); nothing here is per mini-batch.

Sort-based dedup (one stable sort of the keys; Thrust's radix sort under CuPy) rather than hashing
into the table: its output order is defined by the keys alone, so it equals the host's hash-based
``hps.mem.unique_counts`` (first-occurrence order) and the same batch gets the same plan on either
device, whatever the threads' timing.
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError, InvalidTypeError

__all__ = ["unique_inverse", "unique_keys", "lookup_slots", "missing_keys"]


def unique_inverse(keys, xp):
    """(uniq (u,) uint64, inv (n,) int64) of keys (n,) uint64 (an ``xp`` array): the distinct keys in
    order of first occurrence and, for every key, its index in ``uniq`` -- what ``hps.mem.unique_counts``
    returns on the host. Asynchronous on ``xp``'s current stream (CuPy syncs only to size ``uniq``)."""
    _check(keys)
    n = int(keys.shape[0])
    if n == 0:
        return keys[:0].copy(), xp.zeros(0, np.int64)
    order, sk, head = _sorted_heads(keys, xp)
    group = xp.cumsum(head) - 1                       # each sorted key's group, in key order
    first = order[head]                               # each group's first position in the input
    rank = xp.argsort(first)                          # groups by first occurrence (distinct values)
    place = xp.empty(rank.shape[0], np.int64)
    place[rank] = xp.arange(rank.shape[0], dtype=np.int64)
    inv = xp.empty(n, np.int64)
    inv[order] = place[group]
    return sk[head][rank], inv


def unique_keys(keys, xp):
    """uniq (u,) uint64 of keys (n,) uint64 (an ``xp`` array): :func:`unique_inverse`'s distinct keys
    (first-occurrence order), without the inverse: the keys at the sorted first positions of their
    groups. Asynchronous on ``xp``'s current stream (CuPy syncs only to size ``uniq``)."""
    _check(keys)
    if keys.shape[0] == 0:
        return keys[:0].copy()
    order, _, head = _sorted_heads(keys, xp)
    return keys[xp.sort(order[head])]


def _sorted_heads(keys, xp):
    """(order, sk, head) of non-empty keys: the stable sort's permutation (equal keys keep their input
    order), the sorted keys, and (n,) bool marking the first (earliest) occurrence of each key."""
    order = xp.argsort(keys, kind="stable")
    sk = keys[order]
    head = xp.empty(keys.shape[0], np.bool_)
    head[0] = True
    head[1:] = sk[1:] != sk[:-1]
    return order, sk, head


def _check(keys) -> None:
    if keys.ndim != 1:
        raise InvalidInputError(f"keys must be 1-D (n,), got shape {tuple(keys.shape)}")
    if keys.dtype != np.uint64:
        raise InvalidTypeError(f"keys must be uint64, got {keys.dtype}")


def lookup_slots(table, ukeys, batch: int, xp, stream=0):
    """(u,) int64 device array of ``xp``: the slot of each of a batch's distinct keys ``ukeys`` in
    ``table`` (an :class:`hps.HashTable` on the keys' device), -1 when not resident, counting a use of
    every resident key in ``batch`` (``HashTable.lookup_async`` on ``stream``). Asynchronous; the
    caller holds the table's lock (``device_view``) as for any launch on its slots."""
    slots = xp.empty(ukeys.shape[0], np.int64)
    if ukeys.shape[0]:
        table.lookup_async(ukeys, batch, slots, stream)
    return slots


def missing_keys(table, ukeys, batch: int, xp, stream=0):
    """(slots (u,) int64, misses (f,) uint64): :func:`lookup_slots` and the keys to fetch, in the order
    of ``ukeys``. Device arrays of ``xp``; the caller copies ``misses`` to the host. Blocks (counting
    the misses)."""
    slots = lookup_slots(table, ukeys, batch, xp, stream)
    return slots, ukeys[slots < 0]
