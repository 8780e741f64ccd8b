"""``HashTable.accumulate`` of present keys at load factor lf. Target (CPU, dim 32, lf 0.5): >= 0.3x np.take rows/s."""

import numpy as np

from bench._table_common import (BATCH, batch_index, filled_table, present_keys, rows_on, run_table_op, skip_without,
                                 table_cases)


@table_cases
def test_accumulate(benchmark, record, lf, dim, dist, device):
    skip_without(device)
    deltas = rows_on(device, np.full((BATCH, dim), 0.5, np.float32))
    idx = batch_index(present_keys(lf).shape[0], dist)
    run_table_op(benchmark, record, lambda t, k: t.accumulate(k, deltas), filled_table(lf, dim, device), idx, lf)
