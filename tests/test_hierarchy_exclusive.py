"""The MEM-PS and the HBM-PS are exclusive: a row fetched into the HBM-PS leaves the MEM-PS (on
``--device cpu`` both are DRAM, so a row held twice doubles its bytes), and nothing is lost by dropping
a dirty copy."""

import numpy as np
import pytest

from hps import HashTable
from hps.mem import MemPS, RowCache, RowInitializer
from hps.train._collectives import Collectives
from hps.train._hierarchy import ParameterHierarchy
from tests.reference.store import DictStore

W = 4


def test_cache_take_drops_unpinned_rows_dirty_or_not_and_keeps_pinned():
    c = RowCache(8, W)
    k = np.arange(1, 7, dtype=np.uint64)
    c.put(k[:3], np.ones((3, W), np.float32), dirty=True)
    c.put(k[3:], np.full((3, W), 2.0, np.float32), pin=True)
    rows, hit = c.take(np.r_[k, [99]].astype(np.uint64))
    assert hit.tolist() == [True] * 6 + [False]
    np.testing.assert_array_equal(rows[:6, 0], [1, 1, 1, 2, 2, 2])
    assert c.contains(k).tolist() == [False] * 3 + [True] * 3        # pinned rows stay
    assert len(c) == 3 and c.stats().dirty == 0 and c.stats().evicted == 0
    c.put(np.arange(10, 15, dtype=np.uint64), np.zeros((5, W), np.float32))  # the slots are free again
    assert len(c) == 8


def _hierarchy(capacity_rows=64, budget_rows=None):
    mem = MemPS(DictStore(W), W, initializer=RowInitializer(2, W, seed=0), capacity_rows=capacity_rows)
    hier = ParameterHierarchy(HashTable(256, W), mem, window=2, owned_mask=Collectives().owned_mask,
                              budget_rows=budget_rows)
    return hier, mem


def _batches(n, rng):
    return [np.unique(rng.integers(1, 120, 40).astype(np.uint64)) for _ in range(n)]


def test_no_row_is_in_both_tiers_and_training_is_lossless():
    rng = np.random.default_rng(0)
    hier, mem = _hierarchy(budget_rows=48)               # HBM-PS + MEM-PS < the 119 keys: spills
    ref_hier, ref_mem = _hierarchy(capacity_rows=4096)    # never evicts: the reference
    batches = _batches(30, rng)
    for h, m in ((hier, mem), (ref_hier, ref_mem)):
        for i, keys in enumerate(batches):
            h.prepare(i, keys)
            resident = h.hbm.export()[0]
            assert resident.shape[0] == len(h.hbm) > 0
            assert not m.cache.contains(resident).any()        # DRAM holds each row once
            h.hbm.accumulate(keys, np.full((keys.shape[0], W), 1.0 + i, np.float32))  # "training"
            h.mark_trained(i)
            if i == 12:
                h.sync_to_store()                               # a checkpoint keeps them apart too
                assert not m.cache.contains(h.hbm.export()[0]).any()
        h.drop_all()
    keys = np.unique(np.concatenate(batches))
    np.testing.assert_array_equal(hier.read_owned(keys), ref_hier.read_owned(keys))
    assert mem.stats()["dumped"] > 0                            # the small one did spill


def test_checkpoint_keeps_rows_prepared_but_not_trained():
    """prepare moves the rows it fetched from the MEM-PS into the HBM-PS; a sync before they are
    trained must still store them, dirty ones included (the store never had them)."""
    hier, mem = _hierarchy()
    keys = np.arange(1, 11, dtype=np.uint64)
    rows = np.arange(40, dtype=np.float32).reshape(10, W)
    mem.push(keys, rows)                                  # dirty in the MEM-PS, not in the store
    hier.prepare(0, keys)
    assert not mem.cache.contains(keys).any() and not mem.store.load(keys)[1].any()
    hier.sync_to_store()                                  # before training
    got, found = mem.store.load(keys)
    assert found.all()
    np.testing.assert_array_equal(got, rows)
    assert not mem.cache.contains(keys).any()             # still held once (by the HBM-PS)
    np.testing.assert_array_equal(hier.read_owned(keys), rows)


def test_rows_evicted_for_the_budget_come_back_as_they_left():
    """An HBM-PS of 10 rows: batch 1's keys evict batch 0's (trained, dirty) into the MEM-PS once
    batch 0 is trained; batch 3 brings them back, fetched from the MEM-PS with their trained values."""
    hier, mem = _hierarchy(budget_rows=10)
    a, c = np.arange(1, 11, dtype=np.uint64), np.arange(50, 60, dtype=np.uint64)
    for i, keys in enumerate((a, c, c)):
        hier.prepare(i, keys)
        hier.hbm.accumulate(keys, np.full((keys.shape[0], W), 2.0, np.float32))
        hier.mark_trained(i)
    assert not hier.hbm.contains(a).any() and mem.cache.contains(a).all()   # evicted, dirty, to the MEM-PS
    trained = hier.read_owned(a)
    assert not np.allclose(trained, RowInitializer(2, W, seed=0)(a))
    prep = hier.prepare(3, a)                      # back: out of the MEM-PS into the HBM-PS
    assert (prep.fetched, prep.evicted) == (10, 10) and not mem.cache.contains(a).any()
    np.testing.assert_array_equal(hier.hbm.get(a)[0], trained)
    np.testing.assert_array_equal(hier.read_owned(a), trained)


class FailingLoads(DictStore):
    def load(self, keys):
        raise OSError("injected read failure")


def test_take_moves_rows_out_without_inserting_or_evicting():
    """take: cached rows leave the cache (a pinned one stays), stored ones are read straight into the
    result, new ones are born there; nothing is inserted, so a full cache evicts nothing; each
    access is remembered while the key is away, so it counts when the row comes back."""
    init = RowInitializer(2, W, seed=0)
    store = DictStore(W)
    mem = MemPS(store, W, initializer=init, capacity_rows=4)
    cached, pinned, stored, new = (np.array([k], np.uint64) for k in (1, 2, 3, 4))
    mem.push(np.r_[cached, pinned], np.array([[1.0] * W, [2.0] * W], np.float32))
    mem.pull(pinned)  # pinned now (and its row is the pushed one)
    mem.push(np.arange(10, 12, dtype=np.uint64), np.zeros((2, W), np.float32))   # the cache is full
    store.dump(stored, np.full((1, W), 3.0, np.float32))
    keys = np.r_[cached, pinned, stored, new]
    rows = mem.take(keys)
    np.testing.assert_array_equal(rows[:3], [[1.0] * W, [2.0] * W, [3.0] * W])
    np.testing.assert_array_equal(rows[3], init(new)[0])
    assert mem.cache.contains(keys).tolist() == [False, True, False, False]
    s = mem.stats()
    assert s["evicted"] == 0 and s["ssd_loads"] == 1 and s["new_rows"] == 1 and s["size"] == 3
    mem.push(cached, rows[:1])                    # back from the HBM-PS, dirty
    assert mem.cache.contains(cached)[0] and mem.stats()["dirty"] >= 1


def test_take_that_fails_to_read_leaves_the_cache_as_it_was():
    store = FailingLoads(W)
    store.dump(np.array([9], np.uint64), np.ones((1, W), np.float32))   # a store that holds rows is asked
    mem = MemPS(store, W, initializer=RowInitializer(2, W, seed=0), capacity_rows=8)
    mem.push(np.array([1], np.uint64), np.ones((1, W), np.float32))
    with pytest.raises(OSError, match="injected"):
        mem.take(np.array([1, 2], np.uint64))
    assert mem.cache.contains(np.array([1], np.uint64))[0]            # the cached row was not lost
    np.testing.assert_array_equal(mem.read(np.array([1], np.uint64))[0], np.ones(W))


class _GatheringTable:
    """The CPU twin without ``evict_into``: the hierarchy gathers the victims' rows (``evict``), as on the GPU."""

    def __init__(self, table):
        self._t = table

    def __getattr__(self, name):
        if name == "evict_into":
            raise AttributeError(name)
        return getattr(self._t, name)

    def __len__(self):
        return len(self._t)


@pytest.mark.parametrize("owned", ["all", "even"])
def test_victims_read_in_place_reach_the_mem_ps_as_gathered_ones_do(owned):
    """Evictions through ``evict_into`` (the twin's slot array and the victims' slots handed to
    ``MemPS.push``, no gather) leave the MEM-PS, its store and the HBM-PS as the gathering path does,
    whether the rank owns every victim or only some (``at`` selects them)."""
    mask = (lambda k: np.ones(k.shape[0], bool)) if owned == "all" else (lambda k: k % 2 == 0)
    runs = []
    for wrap in (lambda t: t, _GatheringTable):
        mem = MemPS(DictStore(W), W, initializer=RowInitializer(2, W, seed=0), capacity_rows=24)
        hier = ParameterHierarchy(wrap(HashTable(256, W)), mem, window=2, owned_mask=mask, budget_rows=48)
        rng = np.random.default_rng(3)
        for i, keys in enumerate(_batches(25, rng)):
            hier.prepare(i, keys)
            hier.hbm.accumulate(keys, np.full((keys.shape[0], W), 1.0 + i, np.float32))
            hier.mark_trained(i)
        assert hier.evicted > 100
        resident = hier.hbm.export()
        hier.drop_all()
        runs.append((mem, resident, hier.evicted))
    (m1, r1, e1), (m2, r2, e2) = runs
    assert e1 == e2
    np.testing.assert_array_equal(r1[0], r2[0])
    np.testing.assert_array_equal(r1[1], r2[1])
    assert m1.stats()["evicted"] == m2.stats()["evicted"] and m1.stats()["dumped"] == m2.stats()["dumped"]
    assert m1.store.d.keys() == m2.store.d.keys() and len(m1.store.d) > 0
    for k in m1.store.d:
        np.testing.assert_array_equal(m1.store.d[k], m2.store.d[k])
    a, b = m1.cache.dirty_rows(), m2.cache.dirty_rows()
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


class FailingDeletes(DictStore):
    def delete(self, keys):
        raise OSError(28, "No space left on device")   # SSDStore.delete writes a tombstone file now


def test_a_delete_the_store_refuses_leaves_every_tier_its_rows():
    """Expiry's delete when the SSD-PS fails (its disk full): the rows of the tiers above, newer than the
    store's, stay where they were (they were dropped before the store was asked)."""
    store = FailingDeletes(W)
    mem = MemPS(store, W, initializer=RowInitializer(2, W, seed=0), capacity_rows=8)
    hier = ParameterHierarchy(HashTable(64, W), mem, window=2, owned_mask=Collectives().owned_mask)
    cached, resident = np.array([1], np.uint64), np.array([2], np.uint64)
    store.dump(np.r_[cached, resident], np.zeros((2, W), np.float32))
    mem.push(cached, np.ones((1, W), np.float32))                       # newer than the store's, dirty
    hier.prepare(0, resident)
    hier.hbm.accumulate(resident, np.full((1, W), 5.0, np.float32))    # "trained" in the HBM-PS
    hier.mark_trained(0)
    want = hier.read_owned(np.r_[cached, resident])
    with pytest.raises(OSError, match="No space"):
        hier.delete(np.r_[cached, resident])
    np.testing.assert_array_equal(hier.read_owned(np.r_[cached, resident]), want)
    assert mem.cache.contains(cached)[0] and hier.hbm.contains(resident)[0]
