"""``HashTable.insert`` throughput. Target (CPU, dim 32, lf 0.5): >= 0.3x np.take rows/s.

Both cases insert the same batch as the other operations (BATCH draws over the present keys):

- ``new``: every distinct key of the batch is absent. Before each round, untimed, the table is
  cleared and refilled with every present key the batch does not draw
  (:func:`bench._table_common.keys_outside`), so the insert claims a slot per distinct key and the
  table ends at load factor lf.
- ``overwrite``: the table already holds every present key (load factor lf); insert assigns rows.
"""

import numpy as np
import pytest

from bench._table_common import (BATCH, batch_index, empty_table, fill, filled_table, keys_outside, present_keys,
                                 rows_on, run_table_op, skip_without, table_cases)


@pytest.mark.parametrize("keys", ["new", "overwrite"])
@table_cases
def test_insert(benchmark, record, lf, dim, dist, device, keys):
    skip_without(device)
    values = rows_on(device, np.full((BATCH, dim), 2.0, np.float32))
    idx = batch_index(present_keys(lf).shape[0], dist)
    op = lambda t, k: t.insert(k, values)  # noqa: E731
    if keys == "overwrite":
        run_table_op(benchmark, record, op, filled_table(lf, dim, device), idx, lf, insert=keys)
        return
    others = keys_outside(lf, idx)

    def refill(t):
        t.clear()
        fill(t, others)

    run_table_op(benchmark, record, op, empty_table(lf, dim, device), idx, lf, setup=refill, insert=keys)
