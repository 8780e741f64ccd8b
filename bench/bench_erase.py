"""``HashTable.erase`` of a batch of present keys (re-inserted, untimed, before every round)."""

import numpy as np
import pytest

from bench._table_common import DEVICES, DIMS, DISTS, LOAD_FACTORS, BATCH, cuda_ok, run_table_op


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("lf", LOAD_FACTORS)
def test_erase(benchmark, record, lf, dim, dist, device):
    if device == "cuda" and not cuda_ok():
        pytest.skip("no CUDA GPU")
    ones = np.ones((BATCH, dim), np.float32)
    if device == "cuda":
        from numba import cuda

        ones = cuda.to_device(ones)
    run_table_op(benchmark, record, lambda t, k: t.erase(k), lf, dim, dist, device,
                 setup=lambda t, k: t.insert(k, ones))
