"""``HashTable.get`` throughput. Target (CPU, dim 32, lf 0.5): >= 0.5x np.take rows/s, >= 10x dict.

``test_get[...-out]`` writes into a preallocated buffer and is compared with ``np.take(out=)``;
``test_get[...-alloc]`` returns new arrays and is compared with the allocating ``np.take``.
``test_get_dict_peer`` measures two Python ``dict`` peers beside ``get(out=)`` at the target point.
"""

import numpy as np
import pytest

from bench._table_common import (BATCH, batch_index, filled_table, present_keys, rows_on, rows_per_sec,
                                 run_table_op, skip_without, table_cases)


@pytest.mark.parametrize("buffer", ["out", "alloc"])
@table_cases
def test_get(benchmark, record, lf, dim, dist, device, buffer):
    skip_without(device)
    table = filled_table(lf, dim, device)
    idx = batch_index(present_keys(lf).shape[0], dist)
    if buffer == "out":
        out = rows_on(device, np.empty((BATCH, dim), np.float32))
        op = lambda t, k: t.get(k, out=out)  # noqa: E731
    else:
        op = lambda t, k: t.get(k)  # noqa: E731
    run_table_op(benchmark, record, op, table, idx, lf, take_out=buffer == "out", buffer=buffer)


DICT_PEERS = {
    "dict-lookup": "the lookups alone: [d[k] for k in keys] over a list of Python ints made untimed",
    "dict-table": "a dict-backed table: uint64 array in, keys.tolist(), d[k] -> row index, np.take(out=) "
                  "of the rows",
}


@pytest.mark.parametrize("peer", list(DICT_PEERS))
def test_get_dict_peer(benchmark, record, peer):
    """The Python dict peers at the target point (lf 0.5, dim 32, uniform, cpu), every key present,
    beside ``get(out=)`` on the same batch measured in the same test."""
    lf, dim = 0.5, 32
    present = present_keys(lf)
    keys = present[batch_index(present.shape[0], "uniform")]
    d = dict(zip(present.tolist(), range(present.shape[0])))   # key -> row index
    rows = np.ones((present.shape[0], dim), np.float32)
    out = np.empty((BATCH, dim), np.float32)
    if peer == "dict-lookup":
        key_list = keys.tolist()

        def run():
            return [d[k] for k in key_list]
    else:
        def run():
            pos = np.array([d[k] for k in keys.tolist()], dtype=np.int64)
            return np.take(rows, pos, axis=0, out=out, mode="clip")

    benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1)
    peer_ops = BATCH / benchmark.stats.stats.min
    table = filled_table(lf, dim)
    table.get(keys, out=out)  # warm-up (JIT)
    hps_ops = rows_per_sec(lambda: table.get(keys, out=out))
    record(keys_per_s=peer_ops, peer=peer, measures=DICT_PEERS[peer], hps_get_out_keys_per_s=hps_ops,
           hps_over_peer=hps_ops / peer_ops)
