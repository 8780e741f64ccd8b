"""Shared defaults of the hash-table benchmarks (one file per operation, like cuCollections/HKV).

Workload: a table of ``N_SLOTS`` slots holding the ``lf * N_SLOTS`` keys of :func:`present_keys`
(random uint64), and one batch of ``BATCH`` draws from them: uniform, or Zipf(``ZIPF_A``) over a
random popularity order (:func:`batch_index`). Figures are keys (= rows) per second, printed in
M keys/s.

The memory-bandwidth peer, measured in the same run: ``np.take(..., mode="clip")`` from a dense
(``lf * N_SLOTS``, dim) float32 array, of the very row positions the hps batch touches (same
distribution, same repeats). ``mode="clip"``: NumPy buffers ``out=`` under the default
``mode="raise"``, a slow path. ``get(out=)`` is compared with ``np.take(out=)``, the allocating
``get`` with the allocating ``np.take``; insert, accumulate and erase with ``np.take(out=)``.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np
import pytest

from hps import HashTable
from hps._xp import DEVICES

BATCH = 1 << int(os.environ.get("HPS_BENCH_LOG2_BATCH", "20"))
N_SLOTS = 2 * BATCH
LOAD_FACTORS = (0.5, 0.75, 0.9)
DIMS = (8, 32, 64)
DISTS = ("uniform", "zipf")
ZIPF_A = 1.05
ROUNDS = 5   # keys/s from the fastest round


def table_cases(fn):
    """Parametrize a benchmark over lf x dim x dist x device, ids like ``lf=0.5-dim=32-uniform-cpu``."""
    fn = pytest.mark.parametrize("lf", LOAD_FACTORS, ids=lambda v: f"lf={v}")(fn)
    fn = pytest.mark.parametrize("dim", DIMS, ids=lambda v: f"dim={v}")(fn)
    fn = pytest.mark.parametrize("dist", DISTS)(fn)
    return pytest.mark.parametrize("device", DEVICES)(fn)


def cuda_ok() -> bool:
    try:
        from numba import cuda

        return cuda.is_available()
    except Exception:
        return False


def skip_without(device: str) -> None:
    if device == "cuda" and not cuda_ok():
        pytest.skip("no CUDA GPU")


@functools.lru_cache(maxsize=2)
def present_keys(lf: float) -> np.ndarray:
    """(lf * N_SLOTS,) uint64 distinct random keys (sorted)."""
    n = int(lf * N_SLOTS)
    rng = np.random.default_rng(1234)
    return np.unique(rng.integers(0, 2**63, int(n * 1.01), dtype=np.uint64))[:n]


def batch_index(n: int, dist: str, seed: int = 7) -> np.ndarray:
    """(BATCH,) int64 draws from [0, n): uniform, or Zipf(ZIPF_A) ranks over a random popularity order."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        return rng.integers(0, n, BATCH)
    ranks = np.minimum(rng.zipf(ZIPF_A, BATCH) - 1, n - 1)
    return rng.permutation(n)[ranks]


def keys_outside(lf: float, idx: np.ndarray) -> np.ndarray:
    """The present keys (uint64) of ``present_keys(lf)`` that the batch ``idx`` does not draw: an
    insert-new round starts from a table holding exactly these, so every distinct key of the batch
    is new and the table ends at load factor lf."""
    keep = np.ones(present_keys(lf).shape[0], dtype=bool)
    keep[idx] = False
    return present_keys(lf)[keep]


def rows_on(device: str, rows: np.ndarray):
    """``rows`` where the table lives: a NumPy array for "cpu", a device copy for "cuda"."""
    if device == "cuda":
        from numba import cuda

        return cuda.to_device(rows)
    return rows


def sync(device: str) -> None:
    if device == "cuda":
        from numba import cuda

        cuda.synchronize()


def fill(table: HashTable, keys: np.ndarray) -> None:
    """Insert ``keys`` (host uint64) with rows of ones, BATCH keys per call."""
    for a in range(0, keys.shape[0], BATCH):
        k = keys[a:a + BATCH]
        table.insert(k, np.ones((k.shape[0], table.dim), np.float32))


def empty_table(lf: float, dim: int, device: str = "cpu") -> HashTable:
    """A table of N_SLOTS slots sized for ``present_keys(lf)`` at max load factor lf."""
    table = HashTable(present_keys(lf).shape[0], dim, device=device, max_load_factor=lf)
    assert table.n_slots == N_SLOTS
    return table


def filled_table(lf: float, dim: int, device: str = "cpu") -> HashTable:
    table = empty_table(lf, dim, device)
    fill(table, present_keys(lf))
    return table


def rows_per_sec(fn, rounds: int = ROUNDS) -> float:
    """Best-of-``rounds`` rows/s of ``fn`` processing ``BATCH`` rows."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return BATCH / best


def take_rows_per_sec(n_rows: int, dim: int, idx: np.ndarray, out: bool = True) -> float:
    """Peer: ``np.take(mode="clip")`` of the rows ``idx`` (BATCH,) from an (n_rows, dim) float32 array,
    into a preallocated ``out`` or allocating."""
    dense = np.ones((n_rows, dim), np.float32)
    if not out:
        return rows_per_sec(lambda: np.take(dense, idx, axis=0, mode="clip"))
    buf = np.empty((idx.shape[0], dim), np.float32)
    return rows_per_sec(lambda: np.take(dense, idx, axis=0, out=buf, mode="clip"))


def run_table_op(benchmark, record, op, table, idx, lf, setup=None, take_out=True, **extra):
    """Benchmark ``op(table, keys)`` on the batch ``keys = present_keys(lf)[idx]`` and record keys/s
    beside the np.take peer of the same row positions.

    ``setup(table)``, if given, runs untimed before every round (and before the warm-up);
    ``take_out`` picks the peer's ``np.take(out=)`` (True) or allocating form; ``extra`` goes into
    the record. Returns keys/s."""
    device = table.device
    keys = rows_on(device, present_keys(lf)[idx])

    def prepare():
        if setup is not None:
            setup(table)
            sync(device)
        return (), {}

    def once():
        op(table, keys)
        sync(device)

    prepare()
    once()  # warm-up (JIT)
    benchmark.pedantic(once, setup=prepare, rounds=ROUNDS, iterations=1)
    ops = BATCH / benchmark.stats.stats.min
    take = take_rows_per_sec(present_keys(lf).shape[0], table.dim, idx, out=take_out)
    record(keys_per_s=ops, take_rows_per_s=take, ratio_vs_take=ops / take, device=device, **extra)
    return ops
