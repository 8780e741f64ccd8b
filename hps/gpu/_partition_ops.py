"""Partitioning a device batch of keys on the device (Algorithm 2: partition -> scatter -> apply per
part): the device twin of ``group_by_owner(owner_of(keys, n_parts, PART_SALT), n_parts)``.

The policy is ``hps._hashing``'s (``mix64(key ^ salt) % n_parts``), so a key lands in the same part
whichever side computed it. The kernel (``_train_kernels.part_of``) labels every key and counts the
keys of each part with atomics; the stable order is one sort of ``part * m + i`` on the array module
(distinct values, so any sort gives the input order inside each part). Only the n_parts counts come
back to the host, to size the per-part work.

``--device cuda`` training with ``--n-parts`` > 1 partitions every mini-batch's keys with it
(``hps/train/_device_rows.py``); ``PartitionedHashTable``'s own batch calls, whose inputs come from the
host, partition on the host.
"""

from __future__ import annotations

import numpy as np

from .._hashing import PART_SALT
from ..errors import InvalidInputError
from .. import _launch as L
from ._train_ops import K, _dev, _launch_zero

__all__ = ["part_of_async", "partition_keys"]


def part_of_async(keys, n_parts: int, parts, counts, salt=PART_SALT, stream=0) -> None:
    """parts (m,) int32 device, out: the part of each key of keys (m,) uint64 device; counts (n_parts,)
    int64 device, out: zeroed, then the keys per part. Asynchronous (enqueued on ``stream``)."""
    keys = _dev(keys, "keys", np.uint64, 1)
    parts = _dev(parts, "parts", np.int32, 1)
    counts = _dev(counts, "counts", np.int64, 1)
    n = int(n_parts)
    if n < 1 or counts.shape[0] != n:
        raise InvalidInputError(f"need n_parts >= 1 and counts of n_parts entries, got n_parts={n_parts}, "
                                f"counts shape {tuple(counts.shape)}")
    if parts.shape[0] != keys.shape[0]:
        raise InvalidInputError(f"parts must have {keys.shape[0]} rows (one per key), got {tuple(parts.shape)}")
    _launch_zero(counts, stream)
    if keys.shape[0]:
        L.launch(K.part_of, L.grid1(keys.shape[0]), stream, keys, np.uint64(salt), n, parts, counts)


def partition_keys(keys, n_parts: int, xp, ledger=None, purpose: str = "plan", salt=PART_SALT):
    """(order (m,) int64 on the device, offsets (n_parts + 1,) int64 on the host): the keys of part p
    are ``keys[order[offsets[p]:offsets[p + 1]]]``, in input order — what ``group_by_owner(owner_of(
    keys, n_parts, salt), n_parts)`` gives on the host. keys (m,) uint64 device array of ``xp``
    (NumPy under the CUDA simulator). The counts cross to the host through ``ledger`` (a
    TransferLedger, as ``purpose``) when one is given. Blocks until the counts are on the host."""
    m = int(keys.shape[0])
    parts = xp.empty(m, np.int32)
    counts = xp.empty(int(n_parts), np.int64)
    part_of_async(keys, n_parts, parts, counts, salt)
    order = xp.sort(parts.astype(np.int64) * max(m, 1) + xp.arange(m, dtype=np.int64)) % max(m, 1)
    host = ledger.to_host(counts, purpose) if ledger is not None else _host(counts)
    return order, np.concatenate([[0], np.cumsum(host)]).astype(np.int64)


def _host(a):
    return a.get() if hasattr(a, "get") else np.array(a)
