"""``HashTable.accumulate`` at load factor lf. Target (CPU, dim 32, lf 0.5): >= 0.3x np.take rows/s."""

import numpy as np
import pytest

from bench._table_common import BATCH, DEVICES, DIMS, DISTS, LOAD_FACTORS, rows_on, run_table_op, skip_without


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("lf", LOAD_FACTORS)
def test_accumulate(benchmark, record, lf, dim, dist, device):
    skip_without(device)
    deltas = rows_on(device, np.full((BATCH, dim), 0.5, np.float32))
    run_table_op(benchmark, record, lambda t, k: t.accumulate(k, deltas), lf, dim, dist, device)
