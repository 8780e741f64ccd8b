"""``HashTable.erase`` of a batch of present keys (re-inserted, untimed, before every round)."""

import numpy as np
import pytest

from bench._table_common import BATCH, DEVICES, DIMS, DISTS, LOAD_FACTORS, rows_on, run_table_op, skip_without


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("lf", LOAD_FACTORS)
def test_erase(benchmark, record, lf, dim, dist, device):
    skip_without(device)
    ones = rows_on(device, np.ones((BATCH, dim), np.float32))
    run_table_op(benchmark, record, lambda t, k: t.erase(k), lf, dim, dist, device,
                 setup=lambda t, k: t.insert(k, ones))
