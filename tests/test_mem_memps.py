"""MemPS over a store: round trips against a flat dict model; dirty rows always reach the store."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.errors import CacheBudgetError, InvalidInputError
from hps.mem import MemPS, RowCache, RowInitializer, owner_of
from tests.reference.store import DictStore

EMB, W = 3, 4


def _u(keys):
    return np.array(keys, dtype=np.uint64)


def _mem(store, capacity_rows, **kw):
    return MemPS(store, W, initializer=RowInitializer(EMB, W, seed=7), capacity_rows=capacity_rows, **kw)


class FlakyStore(DictStore):
    """A store whose dump raises while ``fail`` is set (nothing written)."""

    fail = False

    def dump(self, keys, rows):
        if self.fail:
            raise OSError("injected dump failure")
        super().dump(keys, rows)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(6, 12), lru_fraction=st.sampled_from([0.0, 0.3, 1.0]),
       steps=st.lists(st.lists(st.integers(0, 29), min_size=1, max_size=6), min_size=1, max_size=25))
def test_round_trip_with_tiny_budget_equals_flat_model(capacity, lru_fraction, steps):
    store = DictStore(W)
    mem = _mem(store, capacity, lru_fraction=lru_fraction)
    init = RowInitializer(EMB, W, seed=7)
    model: dict[int, np.ndarray] = {}
    for step, keys in enumerate(steps):
        k = _u(keys)
        rows = mem.pull(k)
        want = np.stack([model[x] if x in model else init(_u([x]))[0] for x in keys])
        np.testing.assert_array_equal(rows, want)
        new = rows + np.float32(step + 1)  # an "update": the same for duplicates
        mem.push(k, new)
        for x, r in zip(keys, new):
            model[x] = r
        assert mem.stats()["pinned"] == 0
    mem.flush()
    for x, r in model.items():
        np.testing.assert_array_equal(store.d[x], r)
    # a second MemPS over the same store sees everything
    mem2 = _mem(store, capacity)
    ks = sorted(model)
    for i in range(0, len(ks), capacity):  # one batch must fit the budget
        chunk = ks[i:i + capacity]
        got = mem2.pull(_u(chunk))
        np.testing.assert_array_equal(got, np.stack([model[x] for x in chunk]))
        mem2.unpin(_u(chunk))


def test_pipelined_pins_prefetch():
    store = DictStore(W)
    mem = _mem(store, 4)
    a = mem.pull(_u([1, 2]))          # batch i
    mem.pull(_u([2, 3]))              # batch i+1 prefetched: 2 has two pins
    with pytest.raises(CacheBudgetError, match="working set"):
        mem.pull(_u([7, 8]))          # 5 pinned rows > 4
    assert mem.stats()["pinned"] == 3  # the failed pull pinned nothing
    mem.push(_u([1, 2]), a + 1)
    assert mem.stats()["pinned"] == 2  # 2 still pinned by batch i+1
    mem.pull(_u([7, 8]))               # now room: 1 is evicted, dirty -> dumped
    assert 1 in store.d and np.array_equal(store.d[1], a[0] + 1)


def test_failed_dump_keeps_rows_dirty_in_cache():
    store = FlakyStore(W)
    mem = _mem(store, 2, lru_fraction=1.0)
    r = mem.pull(_u([1, 2]))
    mem.push(_u([1, 2]), r + 5)
    store.fail = True
    with pytest.raises(OSError, match="injected"):
        mem.pull(_u([3]))              # needs to evict a dirty row; the dump fails
    cache = mem.cache
    rows, found = cache.peek(_u([1, 2]))
    assert found.all() and sorted(cache.dirty_rows()[0].tolist()) == [1, 2]
    np.testing.assert_array_equal(rows, r + 5)
    assert cache.n_pinned == 0 and store.d == {}
    with pytest.raises(OSError):
        mem.flush()
    store.fail = False
    mem.pull(_u([3]))
    mem.push(_u([3]), mem.cache.peek(_u([3]))[0])
    mem.flush()
    for k, want in zip([1, 2], r + 5):
        np.testing.assert_array_equal(store.d[k], want)
    s = mem.stats()
    assert s["dumped"] >= 2 and s["new_rows"] == 3


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(4, 12), batches=st.lists(st.sets(st.integers(0, 40), min_size=1, max_size=10),
                                                    min_size=1, max_size=12))
def test_push_of_distinct_keys_skips_the_dedup_and_changes_nothing(capacity, batches):
    """``push(distinct=True)`` (the HBM-PS's evictions) leaves the tier as ``push`` does: the same cache
    rows, dirty rows, counters and, after a flush, the same store."""
    mems = [_mem(DictStore(W), capacity) for _ in range(2)]
    for step, ks in enumerate(batches):
        k = _u(sorted(ks, key=lambda x: (x * 7919) % 41))  # distinct, in no particular order
        rows = np.arange(k.shape[0] * W, dtype=np.float32).reshape(-1, W) + step
        mems[0].push(k, rows, unpin=False)
        mems[1].push(k, rows, unpin=False, distinct=True)
        for m in mems:
            m.take(k[::2])  # some leave again, as the HBM-PS fetches them
    a, b = (m.cache.dirty_rows() for m in mems)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    sa, sb = (m.stats() for m in mems)
    np.testing.assert_array_equal(sa.pop("per_batch_hit_rate"), sb.pop("per_batch_hit_rate"))
    assert sa == sb
    for m in mems:
        m.flush()
    assert mems[0].store.d.keys() == mems[1].store.d.keys()
    for x in mems[0].store.d:
        np.testing.assert_array_equal(mems[0].store.d[x], mems[1].store.d[x])


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(4, 12), batches=st.lists(st.sets(st.integers(0, 40), min_size=1, max_size=10),
                                                    min_size=1, max_size=12))
def test_push_of_keys_vouched_absent_changes_nothing(capacity, batches):
    """``push(distinct=True, absent=True)`` (the HBM-PS's write-back of owned rows: exclusive tiers) leaves
    the tier as ``push(distinct=True)`` does when the keys are indeed not cached: the same cache
    rows, dirty rows, counters and store; and a wrong vouch (keys cached) still lands every row."""
    mems = [_mem(DictStore(W), capacity) for _ in range(3)]
    for step, ks in enumerate(batches):
        k = _u(sorted(ks, key=lambda x: (x * 7919) % 41))
        rows = np.arange(k.shape[0] * W, dtype=np.float32).reshape(-1, W) + step
        for m in mems[:2]:
            m.take(k)   # exclusive: the rows leave the MEM-PS when the HBM-PS fetches them
        mems[0].push(k, rows, unpin=False, distinct=True)
        mems[1].push(k, rows, unpin=False, distinct=True, absent=True)
        mems[2].push(k, rows, unpin=False, distinct=True, absent=True)   # cached ones among them
    a, b = (m.cache.dirty_rows() for m in mems[:2])
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    sa, sb = (m.stats() for m in mems[:2])
    np.testing.assert_array_equal(sa.pop("per_batch_hit_rate"), sb.pop("per_batch_hit_rate"))
    assert sa == sb
    keys = _u(range(41))
    np.testing.assert_array_equal(mems[2].read(keys), mems[0].read(keys))
    for m in mems:
        m.flush()
    for m in mems[1:]:
        assert mems[0].store.d.keys() == m.store.d.keys()
        for x in mems[0].store.d:
            np.testing.assert_array_equal(mems[0].store.d[x], m.store.d[x])
    for bad in ({}, {"unpin": False}, {"distinct": True}):   # absent needs distinct and no unpin
        with pytest.raises(InvalidInputError, match="absent=True needs distinct=True and unpin=False"):
            mems[0].push(k, rows, absent=True, **bad)


@settings(max_examples=40, deadline=None)
@given(capacity=st.integers(3, 10), batches=st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=9),
                                                    min_size=1, max_size=10), distinct=st.booleans())
def test_push_reading_rows_in_place_equals_push_of_the_gathered_rows(capacity, batches, distinct):
    """``push(keys, rows, at=at)`` (rows read at ``rows[at[i]]``: the CPU twin's slot array) leaves the
    tier as ``push(keys, rows[at])`` does, with keys cached or not, repeated (later ones win) or not."""
    mems = [_mem(DictStore(W), capacity) for _ in range(2)]
    rng = np.random.default_rng(len(batches))
    for step, ks in enumerate(batches):
        k = _u(list(dict.fromkeys(ks)) if distinct else ks)
        table = rng.standard_normal((2 * k.shape[0] + 1, W)).astype(np.float32)
        at = rng.permutation(table.shape[0])[:k.shape[0]].astype(np.int64)
        mems[0].push(k, table[at], unpin=False, distinct=distinct)
        mems[1].push(k, table, unpin=False, distinct=distinct, at=at)
        for m in mems:
            m.take(np.unique(k)[1::3])   # take wants distinct keys
    for m in mems:
        m.flush()
    sa, sb = (m.stats() for m in mems)
    np.testing.assert_array_equal(sa.pop("per_batch_hit_rate"), sb.pop("per_batch_hit_rate"))
    assert sa == sb
    assert mems[0].store.d.keys() == mems[1].store.d.keys()
    for x in mems[0].store.d:
        np.testing.assert_array_equal(mems[0].store.d[x], mems[1].store.d[x])
    keys = _u(range(31))
    np.testing.assert_array_equal(mems[0].read(keys), mems[1].read(keys))


def test_push_refuses_rows_at_outside_the_array():
    mem = _mem(DictStore(W), 4)
    with pytest.raises(InvalidInputError):
        mem.push(_u([1, 2]), np.zeros((2, W), np.float32), at=np.array([0, 2]))


def test_push_of_uncached_keys_and_stats():
    store = DictStore(W)
    mem = _mem(store, 3)
    mem.push(_u([10, 11, 12, 13]), np.ones((4, W)))  # not pulled: inserted dirty, evictions dumped
    mem.flush()
    assert sorted(store.d) == [10, 11, 12, 13]
    rows = mem.pull(_u([10, 10, 99]))
    np.testing.assert_array_equal(rows[0], np.ones(W))
    np.testing.assert_array_equal(rows[1], np.ones(W))
    s = mem.stats()
    assert s["ssd_loads"] + s["hits"] == 1 and s["new_rows"] == 1
    assert s["per_batch_hit_rate"].shape == (1,)
    assert s["budget_bytes"] == 3 * W * 4


def test_budget_bytes_cover_the_cache_structures():
    """budget_bytes is the cache's DRAM with its state, key map and ghost table (the rows alone took
    2.1-3x of it before), and a budget below one row of those is refused."""
    budget = 4 << 20
    mem = MemPS(DictStore(32), 32, budget_bytes=budget, initializer=RowInitializer(16, 32))
    assert mem.cache.capacity_rows == RowCache.rows_for_bytes(budget, 32) < budget // 128 // 2
    keys = np.arange(40_000, dtype=np.uint64)
    mem.push(keys, np.ones((keys.shape[0], 32), np.float32))   # more rows than fit: the first are dumped
    assert len(mem.cache) == mem.cache.capacity_rows and mem.cache.nbytes <= budget
    with pytest.raises(InvalidInputError, match="cannot hold 1 cache rows"):
        MemPS(DictStore(W), W, budget_bytes=1000, initializer=RowInitializer(EMB, W))


def test_budget_bytes_count_the_store_index_as_it_grows(tmp_path):
    """Over an SSDStore the cache yields to the store's key index as the table grows: the tier's
    DRAM (cache + index + block crcs) stays within budget_bytes, also at each rebuild of the index
    (old and new arrays and the entries moved), every row stays readable, and once the index alone
    outgrows the budget a write is one clear CacheBudgetError that loses nothing."""
    from hps._index import KeyIndex

    ssd = pytest.importorskip("hps.ssd")
    budget, width = 3 << 20, 32
    init = RowInitializer(16, width)
    rng = np.random.default_rng(1)
    held = []   # DRAM of the tier at each rebuild of the store's index, and after each step
    caps = []
    with ssd.SSDStore(tmp_path / "store", width, rows_per_file=4096,
                      options=ssd.SSDOptions(background=False, compact_batch_bytes=64 << 10)) as store:
        mem = MemPS(store, width, budget_bytes=budget, initializer=init)
        crcs = lambda: sum(f.crcs.nbytes for f in store._cat._files.values())  # noqa: E731 (its lock is held)
        alloc = KeyIndex._alloc

        def watched(index, capacity):
            old, moved = index.nbytes, (16 + 8 * index.width) * len(index)
            alloc(index, capacity)
            held.append(mem.cache.nbytes + crcs() + old + moved + index.nbytes)

        written = np.empty(0, np.uint64)
        with mock.patch.object(KeyIndex, "_alloc", watched), pytest.raises(CacheBudgetError, match="key index .* has outgrown this budget"):
            for step in range(400):
                keys = np.arange(step * 1000, (step + 1) * 1000, dtype=np.uint64)
                keys = np.concatenate([keys, rng.choice(written, min(300, written.shape[0]), replace=False)])
                rows = mem.pull(keys)
                mem.push(keys, rows + 1)
                written = np.union1d(written, keys)
                held.append(mem.cache.nbytes + store.index_bytes())
                caps.append(mem.cache.capacity_rows)
        assert max(held) <= budget
        assert min(caps) <= max(caps) // 2   # the cache gave way to the index
        assert written.shape[0] > 10_000 and mem.stats()["dumped"] > 0
        rows = mem.read(written)
        assert (rows[:, :16] != init(written)[:, :16]).all()   # every row was updated, none lost


def test_a_budget_below_an_empty_stores_index_says_so_and_by_how_much(tmp_path):
    """The MEM-PS keeps room for its store's first index rebuild from its start: a budget below it
    is refused at construction with what the index takes then (not "the table has outgrown this
    budget": the table is empty) and by how much to raise it, and the budget raised by that much
    is accepted."""
    import re

    ssd = pytest.importorskip("hps.ssd")
    with ssd.SSDStore(tmp_path / "store", W, options=ssd.SSDOptions(background=False)) as store:
        index = store.index_bytes(store.index_room() + 1)
        with pytest.raises(InvalidInputError) as err:
            MemPS(store, W, budget_bytes=index // 2, initializer=RowInitializer(EMB, W))
        msg = str(err.value)
        assert "first rebuild" in msg and "outgrown" not in msg and f"({index:,} B" in msg
        more = int(re.search(r"raise the budget by at least ([0-9,]+) B", msg).group(1).replace(",", ""))
        mem = MemPS(store, W, budget_bytes=index // 2 + more, initializer=RowInitializer(EMB, W))
        assert mem.cache.capacity_rows >= 1


def test_initializer_determinism():
    init = RowInitializer(8, 10, seed=3, scale=0.05, state_value=0.1)
    keys = _u([5, 1, 2**63 + 4, 5])
    a = init(keys)
    assert a.dtype == np.float32 and a.shape == (4, 10)
    np.testing.assert_array_equal(a[0], a[3])
    np.testing.assert_array_equal(init(keys[::-1])[::-1], a)          # order does not matter
    again = RowInitializer(8, 10, seed=3, scale=0.05, state_value=0.1)
    np.testing.assert_array_equal(again(keys[1:2]), a[1:2])
    assert not np.array_equal(RowInitializer(8, 10, seed=4)(keys)[:, :8], a[:, :8])
    np.testing.assert_array_equal(a[:, 8:], np.float32(0.1))
    big = init(np.arange(20000, dtype=np.uint64))[:, :8]
    assert big.min() >= -0.05 and big.max() < 0.05
    assert abs(big.mean()) < 1e-3 and abs(big.std() - 0.05 / np.sqrt(3)) < 1e-3
    assert len(np.unique(big[:, 0])) > 19000  # columns and keys are not collapsed
    assert abs(np.corrcoef(big[:, 0], big[:, 1])[0, 1]) < 0.05


def test_owner_of_partition():
    keys = np.arange(1, 10001, dtype=np.uint64)
    o = owner_of(keys, 4)
    assert o.dtype == np.int32 and set(np.unique(o)) == {0, 1, 2, 3}
    assert np.all(np.bincount(o) > 2300)
    np.testing.assert_array_equal(owner_of(keys, 4), o)
    assert (owner_of(keys, 1) == 0).all()


def test_round_trip_over_real_ssdstore(tmp_path):
    ssd = pytest.importorskip("hps.ssd")
    rng = np.random.default_rng(5)
    init = RowInitializer(EMB, W, seed=7)
    model: dict[int, np.ndarray] = {}
    with ssd.SSDStore(tmp_path / "store", W, rows_per_file=16) as store:
        mem = _mem(store, 32, lru_fraction=0.25)
        for step in range(40):
            keys = rng.integers(0, 200, size=20).astype(np.uint64)
            rows = mem.pull(keys)
            want = np.stack([model[x] if x in model else init(_u([x]))[0] for x in keys.tolist()])
            np.testing.assert_array_equal(rows, want)
            mem.push(keys, rows + 1)
            for x, r in zip(keys.tolist(), rows + 1):
                model[x] = r
        mem.flush()
        assert mem.stats()["ssd_loads"] > 0 and mem.stats()["dumped"] > 0
    with ssd.SSDStore(tmp_path / "store", W, rows_per_file=16) as store:
        ks = _u(sorted(model))
        got, found = store.load(ks)
        assert found.all()
        np.testing.assert_array_equal(got, np.stack([model[x] for x in ks.tolist()]))


def test_threads_share_one_memps():
    import threading

    store = DictStore(W)
    mem = _mem(store, 16)
    errors = []

    def worker(t):
        try:
            for step in range(30):
                keys = _u([t * 100 + (step * 7 + j) % 25 for j in range(4)])
                rows = mem.pull(keys)
                mem.push(keys, rows + 1)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    mem.flush()
    init = RowInitializer(EMB, W, seed=7)
    for t in range(4):
        counts: dict[int, int] = {}
        for step in range(30):
            for j in range(4):
                k = t * 100 + (step * 7 + j) % 25
                counts[k] = counts.get(k, 0) + 1
        for k, c in counts.items():
            np.testing.assert_allclose(store.d[k], init(_u([k]))[0] + c, rtol=1e-6)


def test_from_config():
    from hps.errors import InvalidInputError
    from hps.mem import MemConfig

    cfg = MemConfig(budget_bytes=64 << 10, seed=7, ghost_factor=1.0)
    mem = MemPS.from_config(DictStore(W), EMB, W, cfg)
    assert mem.cache.capacity_rows == RowCache.rows_for_bytes(64 << 10, W, ghost_factor=1.0) > 0
    np.testing.assert_array_equal(mem.pull(_u([3])), RowInitializer(EMB, W, seed=7)(_u([3])))
    with pytest.raises(InvalidInputError):
        MemConfig(lru_fraction=2.0)


def test_flush_dumps_in_bounded_chunks():
    """A flush of many dirty rows hands the store bounded chunks, and every row reaches it."""
    from hps.mem import RowCache

    cache = RowCache(1000, 4)
    keys = np.arange(1, 801, dtype=np.uint64)
    cache.put(keys, np.tile(keys[:, None], (1, 4)).astype(np.float32), dirty=True, pin=False, freq=1)
    calls = []

    def dump(k, r):
        calls.append((k.copy(), r.copy()))

    assert cache.flush(dump, chunk_bytes=100 * 16) == 800
    assert len(calls) == 8 and max(c[0].shape[0] for c in calls) == 100
    got = np.concatenate([c[0] for c in calls])
    assert sorted(got.tolist()) == keys.tolist()
    assert all((c[1][:, 0] == c[0]).all() for c in calls)
    assert cache.flush(dump) == 0  # all clean now


def test_initializer_fill_writes_rows_in_place_and_checks_shapes():
    init = RowInitializer(EMB, W, seed=7)
    out = np.full((4, W), -1.0, np.float32)
    keys = _u([9, 3])
    init.fill(keys, out, np.array([2, 0]))
    np.testing.assert_array_equal(out[[2, 0]], init(keys))
    assert (out[[1, 3]] == -1).all()                                 # other rows untouched
    with pytest.raises(InvalidInputError, match="fill needs"):
        init.fill(keys, np.zeros((4, W + 1), np.float32), np.array([0, 1]))
    with pytest.raises(InvalidInputError, match="fill needs"):
        init.fill(keys, out, np.array([0]))


def _three_tiers():
    """A MemPS whose keys 10, 11 are cached (dirty), 20, 21 only in its store; any other key is new."""
    store = DictStore(W)
    store.dump(_u([20, 21]), np.full((2, W), 5, np.float32))
    mem = _mem(store, capacity_rows=8)
    mem.push(_u([10, 11]), np.full((2, W), 3, np.float32))
    return mem


def test_take_writes_each_row_at_its_place_in_a_given_array():
    """``take(keys, out, at)`` (the CPU twin of the HBM-PS passes its slot array and the keys' slots)
    moves the same rows as ``take(keys)`` -- cached, from the store, born -- each to ``out[at[i]]``,
    other rows of ``out`` untouched; a row outside ``out`` is refused before anything moves."""
    mems = [_three_tiers(), _three_tiers()]
    keys = _u([11, 20, 30, 10, 21, 31])                                 # cached, stored, born
    want = mems[0].take(keys)
    out = np.full((10, W), -1, np.float32)
    at = np.array([9, 0, 4, 2, 7, 5], np.int64)
    with pytest.raises(InvalidInputError, match="at must be"):
        mems[1].take(keys, out, np.array([9, 0, 4, 2, 7, 10], np.int64))
    assert mems[1].take(keys, out, at) is out
    np.testing.assert_array_equal(out[at], want)
    assert (np.delete(out, at, axis=0) == -1).all()
    assert mems[0].stats() == mems[1].stats()                           # the same moves, counted alike


@pytest.mark.parametrize("keys", [[11, 20, 30, 10, 21, 31], [30, 31], [11, 20]])
def test_take_leaving_born_rows_marks_them_and_writes_the_rest(keys):
    """``take(keys, leave_born=True)`` (a GPU HBM-PS makes the rows of new keys itself): the same moves
    and counts as ``take(keys)``, every row but the born ones written, and ``born`` marks exactly the
    keys neither cached nor stored -- all of them, some, or none."""
    mems = [_three_tiers(), _three_tiers()]
    k = _u(keys)
    want = mems[0].take(k)
    out = np.full((k.shape[0], W), np.nan, np.float32)
    rows, born = mems[1].take(k, out, leave_born=True)
    assert rows is out
    np.testing.assert_array_equal(born, k >= 30)
    np.testing.assert_array_equal(rows[~born], want[~born])
    assert np.isnan(rows[born]).all()
    np.testing.assert_array_equal(mems[1].initializer(k[born]), want[born])  # what the device must make
    assert mems[0].stats() == mems[1].stats()


def test_take_of_a_large_batch_probes_once_and_moves_every_row():
    """``take`` of thousands of keys (far more than the R keys its probes hash and prefetch ahead:
    ``find``'s ring, then ``take`` at the slots found) against what the tiers held before: every row is
    the one ``read`` gave, unpinned cached keys left the cache, pinned ones stayed, misses came from the
    store or were born; and ``contains`` of the batch is exact set membership."""
    rng = np.random.default_rng(7)
    store = DictStore(W)
    keys = rng.choice(1 << 40, 6000, replace=False).astype(np.uint64)
    store.dump(keys[4000:5000], rng.standard_normal((1000, W)).astype(np.float32))   # in the store only
    mem = _mem(store, capacity_rows=4096)
    mem.push(keys[:3000], rng.standard_normal((3000, W)).astype(np.float32))        # cached, dirty
    mem.pull(keys[:500])                                                             # cached and pinned
    order = rng.permutation(6000)
    batch = keys[order]
    cached = set(keys[:3000].tolist())
    np.testing.assert_array_equal(mem.cache.contains(batch), [int(k) in cached for k in batch])
    want = mem.read(batch)
    np.testing.assert_array_equal(mem.take(batch), want)
    left = mem.cache.contains(keys)
    assert left[:500].all() and not left[500:].any()


class CountingStore(DictStore):
    """A store that counts the keys it is asked for."""

    asked = 0

    def load_into(self, keys, out, at):
        self.asked += np.asarray(keys).shape[0]
        return super().load_into(keys, out, at)


def test_an_empty_store_is_not_asked_for_misses():
    """Misses of ``pull``, ``take`` and ``read`` are born from the initializer without asking a store
    that holds nothing (``len`` 0); once it holds rows it is asked, and its rows win over new ones."""
    store = CountingStore(W)
    mem, init = _mem(store, 4), RowInitializer(EMB, W, seed=7)
    np.testing.assert_array_equal(mem.pull(_u([1, 2])), init(_u([1, 2])))
    mem.push(_u([1, 2]), np.ones((2, W), np.float32))
    np.testing.assert_array_equal(mem.take(_u([3, 4])), init(_u([3, 4])))
    np.testing.assert_array_equal(mem.read(_u([5])), init(_u([5])))
    assert store.asked == 0 and len(store) == 0
    mem.flush()   # rows 1 and 2 reach the store
    mem.take(_u([1, 2]))
    np.testing.assert_array_equal(mem.take(_u([1, 2, 6])), np.vstack([np.ones((2, W)), init(_u([6]))]))
    assert store.asked == 3
