"""``HashTable.get`` throughput. Target (CPU, dim 32, lf 0.5): >= 0.5x np.take rows/s, >= 10x dict."""

import numpy as np
import pytest

from bench._table_common import (BATCH, DEVICES, DIMS, DISTS, LOAD_FACTORS, batch_of, present_keys,
                                 rows_on, run_table_op, skip_without)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dist", DISTS)
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("lf", LOAD_FACTORS)
def test_get(benchmark, record, lf, dim, dist, device):
    skip_without(device)
    # like the np.take peer, write into a preallocated buffer (no page faults in the timing)
    out = rows_on(device, np.empty((BATCH, dim), np.float32))
    run_table_op(benchmark, record, lambda t, k: t.get(k, out=out), lf, dim, dist, device)


def test_get_dict_peer(benchmark, record):
    """The Python dict peer at the target point (dim 32, lf 0.5, uniform)."""
    present = present_keys(0.5)
    d = dict.fromkeys(present.tolist())
    rows = np.ones((present.shape[0], 32), np.float32)
    for i, k in enumerate(d):
        d[k] = i
    keys = batch_of(present, "uniform").tolist()

    def lookup():
        idx = [d.get(k, -1) for k in keys]
        return rows[idx]

    benchmark.pedantic(lookup, rounds=2, iterations=1)
    record(keys_per_s=len(keys) / benchmark.stats.stats.min, peer="dict")
