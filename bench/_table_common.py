"""Shared defaults of the hash-table benchmarks (one file per operation, like cuCollections/HKV).

Workload: a table of ``N_SLOTS`` slots filled to load factor ``lf`` with random uint64 keys, then one
batch of ``BATCH`` keys drawn from the present keys — uniformly, or Zipf(``ZIPF_A``) over a random
popularity order. Figures are rows (= keys) per second. Peers measured in the same run:
``np.take`` of the same number of random rows of the same dim from a dense array (the memory-bandwidth
reference) and, for ``get``, a Python ``dict`` doing the same lookups.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np

from hps import HashTable

BATCH = 1 << int(os.environ.get("HPS_BENCH_LOG2_BATCH", "20"))
N_SLOTS = 2 * BATCH
LOAD_FACTORS = (0.5, 0.75, 0.9)
DIMS = (8, 32, 64)
DISTS = ("uniform", "zipf")
ZIPF_A = 1.05
DEVICES = ("cpu", "cuda")


def cuda_ok() -> bool:
    try:
        from numba import cuda

        return cuda.is_available()
    except Exception:
        return False


@functools.lru_cache(maxsize=2)
def present_keys(lf: float) -> np.ndarray:
    n = int(lf * N_SLOTS)
    rng = np.random.default_rng(1234)
    return np.unique(rng.integers(0, 2**63, int(n * 1.01), dtype=np.uint64))[:n]


def batch_of(keys: np.ndarray, dist: str, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        return keys[rng.integers(0, keys.shape[0], BATCH)]
    ranks = np.minimum(rng.zipf(ZIPF_A, BATCH) - 1, keys.shape[0] - 1)
    return keys[rng.permutation(keys.shape[0])[ranks]]


def filled_table(lf: float, dim: int, device: str = "cpu") -> HashTable:
    keys = present_keys(lf)
    table = HashTable(keys.shape[0], dim, device=device, max_load_factor=lf)
    assert table.n_slots == N_SLOTS
    for a in range(0, keys.shape[0], BATCH):
        k = keys[a:a + BATCH]
        table.insert(k, np.ones((k.shape[0], dim), np.float32))
    return table


def rows_per_sec(fn, rounds: int = 5) -> float:
    """Best-of-``rounds`` rows/s of ``fn`` processing ``BATCH`` rows."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return BATCH / best


def take_rows_per_sec(n_rows: int, dim: int) -> float:
    """Peer: ``np.take`` of BATCH random rows from an (n_rows, dim) float32 array."""
    dense = np.ones((n_rows, dim), np.float32)
    idx = np.random.default_rng(3).integers(0, n_rows, BATCH)
    out = np.empty((BATCH, dim), np.float32)
    return rows_per_sec(lambda: np.take(dense, idx, axis=0, out=out))


def rows_on(device: str, rows: np.ndarray):
    """``rows`` where the table lives: a NumPy array for "cpu", a device copy for "cuda"."""
    if device == "cuda":
        from numba import cuda

        return cuda.to_device(rows)
    return rows


def skip_without(device: str) -> None:
    if device == "cuda" and not cuda_ok():
        import pytest

        pytest.skip("no CUDA GPU")


def run_table_op(benchmark, record, op, lf, dim, dist, device="cpu", setup=None):
    """Benchmark ``op(table, keys)`` and record keys/s with the np.take peer's ratio."""
    table = filled_table(lf, dim, device)
    keys = rows_on(device, batch_of(present_keys(lf), dist))

    def once():
        if setup is not None:
            setup(table, keys)
        op(table, keys)
        if device == "cuda":
            from numba import cuda

            cuda.synchronize()

    once()  # warm-up (JIT)
    benchmark.pedantic(once, rounds=5, iterations=1)
    ops = BATCH / benchmark.stats.stats.min
    take = take_rows_per_sec(present_keys(lf).shape[0], dim)
    record(keys_per_s=ops, take_rows_per_s=take, ratio_vs_take=ops / take, device=device)
    return ops
