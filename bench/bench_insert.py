"""``HashTable.insert`` (insert-or-assign at load factor lf). Target (CPU, dim 32, lf 0.5): >= 0.3x np.take."""

import numpy as np
import pytest

from bench._table_common import DEVICES, DIMS, DISTS, LOAD_FACTORS, BATCH, cuda_ok, run_table_op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("lf", LOAD_FACTORS)
def test_insert(benchmark, record, lf, dim, dist, device):
    if device == "cuda" and not cuda_ok():
        pytest.skip("no CUDA GPU")
    values = np.full((BATCH, dim), 2.0, np.float32)
    if device == "cuda":
        from numba import cuda

        values = cuda.to_device(values)
    run_table_op(benchmark, record, lambda t, k: t.insert(k, values), lf, dim, dist, device)
