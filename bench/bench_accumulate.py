"""``HashTable.accumulate`` at load factor lf. Target (CPU, dim 32, lf 0.5): >= 0.3x np.take rows/s."""

import numpy as np
import pytest

from bench._table_common import DEVICES, DIMS, DISTS, LOAD_FACTORS, BATCH, cuda_ok, run_table_op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("lf", LOAD_FACTORS)
def test_accumulate(benchmark, record, lf, dim, dist, device):
    if device == "cuda" and not cuda_ok():
        pytest.skip("no CUDA GPU")
    deltas = np.full((BATCH, dim), 0.5, np.float32)
    if device == "cuda":
        from numba import cuda

        deltas = cuda.to_device(deltas)
    run_table_op(benchmark, record, lambda t, k: t.accumulate(k, deltas), lf, dim, dist, device)
