"""Serial references for hps.comm: what every rank must end with, computed from all ranks' inputs."""

from __future__ import annotations

import numpy as np


def serial_sparse_allreduce(inputs, d, dtype):
    """inputs: list over ranks of (keys (n,), values (n, d)). Returns (sorted unique keys, sums).

    Sums are accumulated in float64 in (rank, position) order with a dict, then cast to ``dtype``.
    """
    acc = {}
    for keys, values in inputs:
        for k, row in zip(np.asarray(keys, dtype=np.uint64).tolist(), np.asarray(values, dtype=np.float64)):
            if k in acc:
                acc[k] = acc[k] + row
            else:
                acc[k] = row.copy()
    ks = sorted(acc)
    out_v = np.array([acc[k] for k in ks], dtype=np.float64).reshape(len(ks), d)
    return np.array(ks, dtype=np.uint64), out_v.astype(dtype)


def serial_dense_allreduce(arrays):
    """Element-wise sum of the per-rank arrays (float64 accumulation, cast back to the input dtype)."""
    total = np.zeros(np.shape(arrays[0]), dtype=np.float64)
    for a in arrays:
        total += np.asarray(a, dtype=np.float64)
    return total.astype(np.asarray(arrays[0]).dtype)


def owner_of(keys, size):
    """The test partition policy: key % size."""
    return (np.asarray(keys, dtype=np.uint64) % np.uint64(size)).astype(np.int32)


def row_of(keys, d):
    """A row that depends only on its key: row[c] = (key % 1000) * (c + 1), float64."""
    k = (np.asarray(keys, dtype=np.uint64) % np.uint64(1000)).astype(np.float64)
    return k[:, None] * np.arange(1, d + 1, dtype=np.float64)[None, :]


def rank_order_sum(arrays):
    """Element-wise ``0 + a_0 + a_1 + ...`` in float32, in list order: what the ordered all-reduces
    (``hps.comm.ordered_allreduce``) give and one process folding its shards must match bit for bit."""
    acc = np.zeros(np.shape(arrays[0]), dtype=np.float32)
    for a in arrays:
        acc = acc + np.asarray(a, dtype=np.float32)
    return acc


def rank_order_sparse_sum(inputs):
    """inputs: list over ranks of (keys (n,), values (n, d) float32) -> {key: row summed in float32 in
    rank order from 0} (a dict: the key order is the algorithm's)."""
    acc = {}
    for keys, values in inputs:
        for k, row in zip(np.asarray(keys, dtype=np.uint64).tolist(), np.asarray(values, dtype=np.float32)):
            acc[k] = acc.get(k, np.zeros_like(row)) + row
    return acc
