"""The HBM-PS is a cache across batches (``--hbm-budget``, ``hps/train/_hierarchy.py``): rows stay
resident after their batch, a resident key is not fetched again, and only when the budget is reached
do the coldest rows (the table's slot score, LRU+LFU) leave, written back to the MEM-PS; the batches in
flight are never evicted; a working set over the budget is a typed error naming both sizes. Jobs end
with the model of a job whose HBM-PS never evicted (spilling to the MEM-PS and SSD-PS is lossless)."""

import json
import threading

import numpy as np
import pytest

from hps import HashTable
from hps.errors import CacheBudgetError
from hps.train import load_export, main
from hps.train._hbm_budget import hbm_row_bytes, hbm_rows_for
from hps.train._hierarchy import ParameterHierarchy
from tests.budgets import train_with_cache_rows
from tests.test_train_hbm_growth import _Rows



def hierarchy(budget_rows, capacity=4, window=3):
    memps = _Rows()
    hier = ParameterHierarchy(HashTable(capacity, 2), memps, window=window,
                              owned_mask=lambda k: np.ones(k.shape[0], bool), budget_rows=budget_rows)
    return hier, memps


def keys(*k):
    return np.array(k, np.uint64)


def test_resident_keys_stay_across_batches_and_are_not_fetched_again():
    hier, _ = hierarchy(budget_rows=None)
    assert hier.prepare(0, keys(1, 2, 3)).fetched == 3
    for i in range(1, 8):  # far past the window: nothing leaves without a budget
        hier.mark_trained(i - 1)
        assert hier.prepare(i, keys(1, 2, 3, 4)).fetched == (1 if i == 1 else 0)
    assert len(hier.hbm) == 4 and hier.fetched == 4 and hier.evicted == 0


def test_the_budget_evicts_the_coldest_rows_never_the_batches_in_flight():
    hier, memps = hierarchy(budget_rows=6, window=2)
    hier.prepare(0, keys(1, 2, 3))       # 1, 2, 3 used once
    hier.mark_trained(0)
    hier.prepare(1, keys(1, 2))          # 1, 2 used twice
    hier.mark_trained(1)
    hier.prepare(2, keys(1, 10, 11, 12))  # 6 resident: full
    hier.mark_trained(2)
    # batch 3 protects batches 2, 3 (keys 1, 10, 11, 12, 20); eligible 2 (2 uses), 3 (1 use): 3 goes first
    p = hier.prepare(3, keys(20))
    assert (p.fetched, p.evicted) == (1, 1)
    (k, rows), = memps.pushed
    assert k.tolist() == [3] and rows[:, 0].tolist() == [3.0]  # written back, its row as it was
    assert len(hier.hbm) == 6 and not hier.hbm.contains(keys(3))[0]
    hier.mark_trained(3)
    p = hier.prepare(4, keys(30, 31))    # protects 20, 30, 31; 10, 11, 12 have 1 use, 2 has 2, 1 has 3
    assert p.evicted == 2 and sorted(memps.pushed[1][0].tolist()) == [10, 11]


def test_when_the_batches_in_flight_hold_the_room_prepare_waits_for_training():
    hier, memps = hierarchy(budget_rows=4, window=3)
    hier.prepare(0, keys(1, 2))
    hier.prepare(1, keys(3, 4))          # full, and batch 0 is not trained yet
    done = threading.Event()
    t = threading.Thread(target=lambda: (hier.prepare(2, keys(5, 6)), done.set()))
    t.start()
    assert not done.wait(0.3)            # batches 0 and 1 are in flight: nothing may leave
    hier.mark_trained(1)
    t.join(10)
    assert done.is_set() and sorted(memps.pushed[0][0].tolist()) == [1, 2]  # the least used, then oldest


def test_a_working_set_over_the_budget_is_a_typed_error_naming_both_sizes():
    hier, _ = hierarchy(budget_rows=3)
    with pytest.raises(CacheBudgetError, match=r"batch 0 has a working set of 4 rows.*HBM-PS budget of 3 rows"):
        hier.prepare(0, keys(1, 2, 3, 4))


def test_budget_rows_are_those_of_the_largest_power_of_two_slot_array():
    per_slot = hbm_row_bytes(8, 4) // 2
    assert hbm_rows_for(1024 * per_slot, 8, 4) == 512
    assert hbm_rows_for(1024 * per_slot - 1, 8, 4) == 256
    assert hbm_rows_for(per_slot, 8, 4) == 0


JOB = ["--rows", "3000", "--fields", "3", "--vocab-per-field", "300", "--batch-size", "250",
       "--minibatch-size", "125", "--hidden", "8", "--embedding-dim", "4", "--no-progress", "--epochs", "2"]


def run(tmp_path, name, *extra):
    out, metrics = tmp_path / name, tmp_path / f"{name}.json"
    assert main([*JOB, "--export", str(out), "--metrics-out", str(metrics), *extra]) == 0
    return load_export(out), json.loads(metrics.read_text())


def same_model(a, b):
    (ka, va, da), (kb, vb, db) = a, b
    oa, ob = np.argsort(ka), np.argsort(kb)
    np.testing.assert_array_equal(ka[oa], kb[ob])
    assert np.abs(va[oa] - vb[ob]).max() <= 1e-5
    for name in da:
        assert np.abs(da[name] - db[name]).max() <= 1e-5


def test_a_budget_that_forces_evictions_and_ssd_spills_trains_the_same_model(tmp_path):
    """The HBM-PS at a fraction of the table, the MEM-PS small enough to spill to the SSD-PS: the rows
    travel down and up again and the job ends with the model of one that held everything."""
    big, mb = run(tmp_path, "big")
    assert mb["hbm_evicted_rows"] == 0
    # a MEM-PS cache of a quarter of the table
    ms = train_with_cache_rows([*JOB, "--hbm-budget", "80KiB", "--rows-per-file", "64"], mb["table_rows"] // 4,
                               tmp_path / "small")
    small = load_export(tmp_path / "small")
    assert ms["hbm_evicted_rows"] > 0 and max(ms["resident_rows"]) < ms["table_rows"]
    assert ms["ssd_bytes_read"] > 0
    same_model(big, small)


def test_parts_evict_over_their_shares_and_train_the_same_model(tmp_path):
    """An HBM-PS of 3 parts under a budget that forces evictions (each part gives its share of the
    victims, ``PartitionedHashTable.evict``) ends with the one-table model."""
    one, _ = run(tmp_path, "one")
    parts, m = run(tmp_path, "parts", "--n-parts", "3", "--hbm-budget", "80KiB")
    assert m["hbm_evicted_rows"] > 0 and max(m["resident_rows"]) <= 512
    same_model(one, parts)


def test_partitioned_evict_takes_n_victims_in_key_order():
    from hps.table import PartitionedHashTable

    t = PartitionedHashTable(3, 64, 2)
    k = np.arange(1, 41, dtype=np.uint64)
    t.insert(k, np.repeat(k.astype(np.float32)[:, None], 2, axis=1))
    t.lookup(k[20:], 5)                      # keys 21..40 used in batch 5: protected from 5 on
    keys, rows = t.evict(12, 5)
    assert keys.shape[0] == 12 and (np.diff(keys.astype(np.int64)) > 0).all() and (keys <= 20).all()
    assert (rows[:, 0] == keys).all() and len(t) == 28
    keys, _ = t.evict(100, 5)                # only 8 eligible left
    assert keys.shape[0] == 8 and len(t) == 20
