"""``HashTable.erase`` of a batch of present keys (re-inserted, untimed, before every round)."""

import numpy as np

from bench._table_common import (BATCH, batch_index, filled_table, present_keys, rows_on, run_table_op, skip_without,
                                 table_cases)


@table_cases
def test_erase(benchmark, record, lf, dim, dist, device):
    skip_without(device)
    ones = rows_on(device, np.ones((BATCH, dim), np.float32))
    idx = batch_index(present_keys(lf).shape[0], dist)
    keys = rows_on(device, present_keys(lf)[idx])
    run_table_op(benchmark, record, lambda t, k: t.erase(k), filled_table(lf, dim, device), idx, lf,
                 setup=lambda t: t.insert(keys, ones))
