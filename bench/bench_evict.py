"""``HashTable.evict``: choose a tenth of a full table's keys by lowest score, bring their keys and rows
back in one transfer and erase them (``hps/table/_cache.py``). The batch's keys are looked up (scores)
and the victims re-inserted, untimed, before every round; keys/s counts victims. The np.take peer is
of as many rows."""

import numpy as np

from bench._table_common import (BATCH, batch_index, filled_table, present_keys, rows_on, run_table_op,
                                 skip_without, table_cases)

#: Victims per round, as a fraction of the resident keys.
EVICT_FRACTION = 0.1


@table_cases
def test_evict(benchmark, record, lf, dim, dist, device):
    skip_without(device)
    table = filled_table(lf, dim, device)
    idx = batch_index(present_keys(lf).shape[0], dist)
    n = int(EVICT_FRACTION * present_keys(lf).shape[0])
    gone = []

    def setup(t):
        if gone:  # put last round's victims back, then score this batch's keys
            k, r = gone.pop()
            t.insert(rows_on(device, k), rows_on(device, r))
        t.lookup(rows_on(device, present_keys(lf)[idx]), 1)

    def op(t, keys):
        gone.append(t.evict(n, protect_from=1))

    ops = run_table_op(benchmark, record, op, table, idx, lf, setup=setup, victims=n)
    record(victims_per_s=ops * n / BATCH)
    assert gone and gone[-1][0].shape == (n,) and np.unique(gone[-1][0]).shape == (n,)
