"""``HashTable.lookup`` throughput: the HBM-PS cache's find of a batch's keys, which also counts a use of
every resident key in its slot's score (``hps/table/_cache.py``). Keys/s beside the np.take peer of the
same row positions (lookup reads no row: the peer bounds what a gather of those rows would cost)."""

from bench._table_common import batch_index, filled_table, present_keys, run_table_op, skip_without, table_cases


@table_cases
def test_lookup(benchmark, record, lf, dim, dist, device):
    skip_without(device)
    idx = batch_index(present_keys(lf).shape[0], dist)
    run_table_op(benchmark, record, lambda t, k: t.lookup(k, 1), filled_table(lf, dim, device), idx, lf)
