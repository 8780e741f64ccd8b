"""RowCache against the reference LRU+LFU cache (tests/reference/cache.py), plus pinning corners."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.errors import CacheBudgetError, InvalidInputError, InvalidTypeError
from hps.mem import RowCache, _cache, replay, unique_counts
from tests.reference.cache import BudgetExceeded, RefCache

W = 2


def _rows(keys, version):
    k = np.asarray(keys, dtype=np.float32)
    return np.stack([k, np.full_like(k, version)], axis=1).reshape(len(keys), W)


def _u(keys):
    return np.array(keys, dtype=np.uint64)


def _check_same_state(fast: RowCache, ref: RefCache):
    keys = sorted(ref.e)
    assert len(fast) == len(keys)
    rows, found = fast.peek(_u(keys))
    assert found.all()
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(rows[i], ref.e[k]["row"])
    np.testing.assert_array_equal(fast.pin_counts(_u(keys)), [ref.e[k]["pins"] for k in keys])
    dk, _ = fast.dirty_rows()
    assert sorted(dk.tolist()) == sorted(k for k in keys if ref.e[k]["dirty"])
    assert fast.n_pinned == ref.n_pinned


def _same_evicted(ev, ref_out):
    assert ev.keys.tolist() == [o[0] for o in ref_out]
    assert ev.dirty.tolist() == [o[2] for o in ref_out]
    assert ev.freq.tolist() == [o[3] for o in ref_out]
    for i, o in enumerate(ref_out):
        np.testing.assert_array_equal(ev.rows[i], o[1])


def _ops(max_key: int, max_len: int, max_room: int, *extra, min_size: int = 0):
    """Hypothesis lists of cache operations on keys 0..max_key (``extra``: more kinds)."""
    keys = st.lists(st.integers(0, max_key), min_size=0, max_size=max_len)
    return st.lists(st.one_of(
        st.tuples(st.just("lookup"), keys, st.booleans()),
        st.tuples(st.just("put"), keys, st.booleans(), st.booleans()),
        st.tuples(st.just("unpin"), keys),
        st.tuples(st.just("update"), keys),
        st.tuples(st.just("make_room"), st.integers(0, max_room)),
        *(st.tuples(st.just(kind), keys if kind == "take" else st.integers(1, max_room)) for kind in extra),
    ), min_size=min_size, max_size=40 if not extra else 60)


ops = _ops(11, 7, 6)
resizing_ops = _ops(40, 12, 12, "take", "set_capacity", min_size=10)


def _same_eviction(fast_call, ref_call, follow_ghost) -> bool:
    """The fast call first (its arrays grow before it evicts: the reference's ghost table follows),
    then the reference: the same victims, or both refuse -> whether they went ahead."""
    try:
        got = fast_call()
    except CacheBudgetError:
        with pytest.raises(BudgetExceeded):
            ref_call()
        return False
    follow_ghost()
    _same_evicted(got, ref_call())
    return True


def _apply(fast: RowCache, ref: RefCache, version: int, op) -> None:
    """Play ``op`` on both caches and check they decided the same. The fast cache's arrays (and its
    ghost table with them) grow at the start of an operation: the reference's ghost follows."""
    kind = op[0]
    cells = fast._s.ghost.shape[0]

    def follow_ghost():
        if fast._s.ghost.shape[0] != cells:
            ref.resize_ghost(fast._s.ghost.shape[0])

    if kind == "lookup":
        _, keys, pin = op
        rows, hit = fast.lookup(_u(keys), pin=pin)
        want_hit, want_n = ref.lookup(keys, pin)
        assert hit.tolist() == want_hit
        assert fast.stats().per_batch_hits[-1] == want_n
        for i, k in enumerate(keys):
            np.testing.assert_array_equal(rows[i], ref.e[k]["row"] if want_hit[i] else np.zeros(W))
    elif kind == "put":
        _, keys, pin, dirty = op
        r = _rows(keys, version)
        freq = [1 + (k % 3) for k in keys]
        # distinct keys none of which is cached: what MemPS inserts, vouching for it (absent=True)
        absent = len(set(keys)) == len(keys) and not any(k in ref.e for k in keys)
        _same_eviction(lambda: fast.put(_u(keys), r, dirty=dirty, pin=pin, freq=np.array(freq), absent=absent),
                       lambda: ref.put(keys, r, [dirty] * len(keys), pin, freq), follow_ghost)
    elif kind == "unpin":
        keys = op[1]
        bad = ref.unpin(keys)
        if bad:
            with pytest.raises(InvalidInputError):
                fast.unpin(_u(keys))
        else:
            fast.unpin(_u(keys))
    elif kind == "update":
        keys = op[1]
        r = _rows(keys, version)
        assert fast.update(_u(keys), r).tolist() == ref.update(keys, r)
    elif kind == "take":
        keys = list(dict.fromkeys(op[1]))
        want = {k: ref.e[k]["row"].copy() for k in keys if k in ref.e}
        rows, hit = fast.take(_u(keys))
        assert hit.tolist() == ref.take(keys)
        for i, k in enumerate(keys):
            if hit[i]:
                np.testing.assert_array_equal(rows[i], want[k])
    elif kind == "make_room":
        _same_eviction(lambda: fast.make_room(op[1]), lambda: ref.make_room(op[1]), follow_ghost)
    else:   # set_capacity: evict down to it, then shrink (or raise) the capacity
        c = op[1]
        if _same_eviction(lambda: fast.evict_to(c), lambda: ref.evict_to(c), follow_ghost):
            fast.set_capacity(c)
            ref.set_capacity(c, int(round(fast.lru_fraction * c)), fast._s.ghost.shape[0])
            assert fast.capacity_rows == c and fast._s.n <= c
    _check_same_state(fast, ref)


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 6), lru_fraction=st.sampled_from([0.0, 0.34, 0.5, 1.0]),
       ghost_factor=st.sampled_from([0.0, 1.0, 3.0, 0.2]), ops=ops)
def test_matches_reference(capacity, lru_fraction, ghost_factor, ops):
    _play(RowCache(capacity, W, lru_fraction=lru_fraction, ghost_factor=ghost_factor), ops)


def _play(fast: RowCache, ops) -> None:
    ref = RefCache(fast.capacity_rows, int(round(fast.lru_fraction * fast.capacity_rows)), fast._s.ghost.shape[0])
    for version, op in enumerate(ops):
        _apply(fast, ref, version, op)
        assert fast._s.n <= fast.capacity_rows


@settings(max_examples=300, deadline=None)
@given(capacity=st.integers(1, 24), lru_fraction=st.sampled_from([0.0, 0.34, 1.0]),
       ghost_factor=st.sampled_from([0.0, 1.0, 3.0]), ops=resizing_ops)
def test_growing_and_shrinking_match_reference(capacity, lru_fraction, ghost_factor, ops):
    """Arrays that start at one slot and double as rows arrive (and shrink with the capacity) make
    the decisions of the reference cache of that capacity: growing changes nothing, set_capacity
    evicts in the policy's order and keeps every row's place in it."""
    with mock.patch.object(_cache, "INITIAL_SLOTS", 1):
        fast = RowCache(capacity, W, lru_fraction=lru_fraction, ghost_factor=ghost_factor)
    assert fast._s.n == 1
    _play(fast, ops)


long_ops = _ops(400, 90, 80, "take", min_size=5)


@settings(max_examples=60, deadline=None)
@given(capacity=st.integers(20, 120), lru_fraction=st.sampled_from([0.0, 0.1, 1.0]),
       ghost_factor=st.sampled_from([0.0, 2.0]), ops=long_ops)
def test_batches_longer_than_the_prefetch_distance_match_reference(capacity, lru_fraction, ghost_factor, ops):
    """``put`` prefetches the map and ghost cells, input row and free slot of the key
    ``prefetch_ahead()`` places ahead, and walks a cursor that far down the LRU part: batches longer
    than that distance, over a free stack that ``take`` scattered and an LRU part that demotes at
    every insertion, still make the reference's decisions (a prefetch is a hint only)."""
    _play(RowCache(capacity, W, lru_fraction=lru_fraction, ghost_factor=ghost_factor), ops)


def test_put_at_reads_the_rows_in_place():
    """``put(at=)`` (rows read from a larger array in place, e.g. the CPU twin's slots) decides and
    stores as ``put`` of the gathered rows, over batches longer than the prefetch distance."""
    rng = np.random.default_rng(7)
    a, b = RowCache(300, W, lru_fraction=0.1), RowCache(300, W, lru_fraction=0.1)
    src = rng.random((5000, W), dtype=np.float32)
    for step in range(40):
        keys = np.unique(rng.integers(0, 2000, 120)).astype(np.uint64)
        rng.shuffle(keys)
        at = rng.choice(src.shape[0], keys.shape[0], replace=False).astype(np.int64)
        ea, eb = a.put(keys, src, dirty=True, at=at), b.put(keys, src[at], dirty=True)
        assert ea.keys.tolist() == eb.keys.tolist() and np.array_equal(ea.rows, eb.rows)
        gone = keys[rng.random(keys.shape[0]) < 0.3]
        (ra, ha), (rb, hb) = a.take(gone), b.take(gone)
        assert np.array_equal(ha, hb) and np.array_equal(ra[ha], rb[hb])
    ka, kb = a.evict_all(), b.evict_all()
    assert ka.keys.tolist() == kb.keys.tolist() and np.array_equal(ka.rows, kb.rows)


def test_growth_keeps_what_the_ghost_remembers():
    """Keys taken out while the cache is small are remembered in its small ghost table; after it
    grew (with its ghost table) their counts come back as the reference's do."""
    with mock.patch.object(_cache, "INITIAL_SLOTS", 1):
        fast = RowCache(24, W, lru_fraction=0.0, ghost_factor=3.0)
    ref = RefCache(24, 0, fast._s.ghost.shape[0])
    for version, op in enumerate([("take", list(range(41))), ("put", list(range(24)), False, True),
                                  ("make_room", 24)]):
        _apply(fast, ref, version, op)
    assert fast._s.ghost.shape[0] == 128 and fast.stats().evicted == 24


def test_memory_follows_the_rows_not_the_capacity():
    """A cache whose capacity is 1 M rows of 128 B holds 10 k rows in the arrays of 16 k slots (a
    4 GiB budget over a 10 k-row table allocated its whole capacity up front before); lowering the
    capacity gives the memory back."""
    big = RowCache.bytes_for(1 << 20, 32)
    c = RowCache(1 << 20, 32)
    keys = np.arange(10_000, dtype=np.uint64)
    for a in range(0, 10_000, 1000):
        c.put(keys[a:a + 1000], np.ones((1000, 32), np.float32))
    assert len(c) == 10_000 and c.nbytes == RowCache.bytes_for(16_384, 32) < big / 50
    rows, found = c.peek(keys)
    assert found.all() and (rows == 1).all()
    ev = c.evict_to(2000)
    c.set_capacity(2000)
    assert ev.keys.shape[0] == 8000 and len(c) == 2000 and c.nbytes == RowCache.bytes_for(2000, 32)
    rows, found = c.peek(keys)
    assert found.sum() == 2000 and (rows[found] == 1).all()
    assert np.intersect1d(keys[found], ev.keys).shape[0] == 0


def test_lru_and_lfu_orders():
    # plain LRU: the least recently used goes first
    c = RowCache(3, 1, lru_fraction=1.0, ghost_factor=0)
    c.put(_u([1, 2, 3]), np.zeros((3, 1)))
    c.lookup(_u([1]), pin=False)
    assert c.put(_u([4]), np.zeros((1, 1))).keys.tolist() == [2]
    # plain LFU: the least frequently used goes first, repeats inside a batch count
    c = RowCache(3, 1, lru_fraction=0.0, ghost_factor=0)
    c.put(_u([1, 2, 3]), np.zeros((3, 1)))
    c.lookup(_u([2, 2, 2, 1]), pin=False)
    ev = c.put(_u([4]), np.zeros((1, 1)))
    assert ev.keys.tolist() == [3] and ev.freq.tolist() == [1]
    assert c.put(_u([5]), np.zeros((1, 1))).keys.tolist() == [4]  # 4 is the only row at freq 1
    ev = c.make_room(3)
    assert ev.keys.tolist() == [5, 1, 2]  # freqs 1, 2, 4


def test_ghost_bytes_are_reported_beside_the_budget():
    # ghost_factor * capacity cells rounded up to a power of two, 16 bytes each; none without ghosts
    c = RowCache(100, 8, ghost_factor=4.0)
    assert c.budget_bytes == 100 * 8 * 4
    assert c.ghost_bytes == 512 * 16
    assert RowCache(100, 8, ghost_factor=0).ghost_bytes == 0


def test_everything_pinned_and_budget_message():
    c = RowCache(4, 8, dtype=np.float32)
    c.put(_u([1, 2, 3, 4]), np.zeros((4, 8)), pin=True)
    with pytest.raises(CacheBudgetError) as ei:
        c.put(_u([5]), np.zeros((1, 8)), pin=True)
    msg = str(ei.value)
    assert "5 rows" in msg and "160 bytes" in msg and "4 rows" in msg and "128 bytes" in msg
    with pytest.raises(CacheBudgetError):
        c.put(_u([5]), np.zeros((1, 8)), pin=False)
    with pytest.raises(CacheBudgetError):
        c.make_room(1)
    assert len(c) == 4 and c.n_pinned == 4  # unchanged
    c.unpin(_u([2]))  # unpin makes rows evictable
    ev = c.put(_u([5]), np.ones((1, 8)), pin=True)
    assert ev.keys.tolist() == [2]
    assert c.pin_counts(_u([1, 2, 5])).tolist() == [1, 0, 1]


def test_pinned_rows_are_never_evicted_and_pins_count():
    c = RowCache(3, 1, lru_fraction=0.0)
    c.put(_u([1]), np.zeros((1, 1)), pin=True)
    c.lookup(_u([1, 1]), pin=True)  # second pin (once per call)
    assert c.pin_counts(_u([1])).tolist() == [2]
    for k in range(10, 30):
        ev = c.put(_u([k]), np.zeros((1, 1)))
        assert 1 not in ev.keys.tolist()
    c.unpin(_u([1]))
    assert c.contains(_u([1])).tolist() == [True]
    c.unpin(_u([1, 1]))
    with pytest.raises(InvalidInputError):
        c.unpin(_u([1]))


def test_working_set_larger_than_budget():
    c = RowCache(4, 1)
    with pytest.raises(CacheBudgetError, match="5 rows"):
        c.put(_u([1, 2, 3, 4, 5]), np.zeros((5, 1)), pin=True)
    assert len(c) == 0


@pytest.mark.parametrize("pin", [True, False])
def test_absent_keys_are_checked_against_the_budget_without_a_probe(pin):
    """``put(absent=True)`` (the caller vouches no key is cached) counts every key as new: the same
    refusal, the cache left as it was, as the probing check's."""
    c = RowCache(4, 1)
    c.put(_u([1, 2]), np.zeros((2, 1)), pin=True)
    with pytest.raises(CacheBudgetError, match="5 rows"):
        c.put(_u([3, 4, 5]), np.zeros((3, 1)), pin=pin, absent=True)
    assert len(c) == 2 and c.n_pinned == 2
    c.put(_u([3, 4]), np.ones((2, 1)), pin=pin, absent=True)
    assert len(c) == 4 and c.n_pinned == (4 if pin else 2) and c.contains(_u([3, 4])).all()


def test_dirty_flags_and_flush():
    c = RowCache(2, 1, lru_fraction=1.0)
    c.put(_u([1, 2]), np.array([[1.0], [2.0]]), dirty=np.array([True, False]))
    assert c.update(_u([2, 9]), np.array([[20.0], [90.0]])).tolist() == [True, False]
    dumped = {}
    assert c.flush(lambda k, r: dumped.update(zip(k.tolist(), r[:, 0].tolist()))) == 2
    assert dumped == {1: 1.0, 2: 20.0}
    assert c.dirty_rows()[0].shape == (0,)

    def boom(k, r):
        raise OSError("disk")
    c.update(_u([1]), np.array([[5.0]]))
    with pytest.raises(OSError):
        c.flush(boom)
    assert c.dirty_rows()[0].tolist() == [1]  # still dirty after a failed dump


def test_empty_batches_and_bad_input():
    c = RowCache(2, 3)
    rows, hit = c.lookup(np.empty(0, np.uint64))
    assert rows.shape == (0, 3) and hit.shape == (0,)
    assert c.put(np.empty(0, np.uint64), np.empty((0, 3))).keys.shape == (0,)
    c.unpin(np.empty(0, np.uint64))
    with pytest.raises(InvalidInputError):
        c.lookup(np.array([2**64 - 1], dtype=np.uint64))
    with pytest.raises(InvalidTypeError):
        c.lookup(np.array([1.5]))
    with pytest.raises(InvalidInputError):
        c.put(_u([1]), np.zeros((1, 2)))
    with pytest.raises(InvalidInputError):
        RowCache(0, 1)
    with pytest.raises(InvalidInputError):
        RowCache(4, 1, lru_fraction=1.5)


def test_restore_puts_rows_back():
    c = RowCache(2, 1, lru_fraction=1.0)
    c.put(_u([1, 2]), np.array([[1.0], [2.0]]), dirty=True)
    ev = c.make_room(2)
    assert len(c) == 0 and ev.keys.tolist() == [1, 2]
    c.restore(ev)
    rows, found = c.peek(_u([1, 2]))
    assert found.all() and rows[:, 0].tolist() == [1.0, 2.0]
    assert sorted(c.dirty_rows()[0].tolist()) == [1, 2]


def test_unique_counts():
    u, c, inv = unique_counts(_u([5, 3, 5, 5, 7, 3]))
    assert u.tolist() == [5, 3, 7] and c.tolist() == [3, 2, 1]
    assert u[inv].tolist() == [5, 3, 5, 5, 7, 3]


@settings(max_examples=150, deadline=None)
@given(capacity=st.integers(3, 12), lru_fraction=st.sampled_from([0.0, 0.34, 1.0]),
       ghost=st.sampled_from([0.0, 2.0]),
       batches=st.lists(st.lists(st.integers(0, 20), min_size=1, max_size=6), max_size=25))
def test_visit_batch_is_lookup_put_unpin(capacity, lru_fraction, ghost, batches):
    """visit_batch (replay's fast path) makes exactly the decisions of the three public calls."""
    fast = RowCache(capacity, 1, lru_fraction=lru_fraction, ghost_factor=ghost)
    slow = RowCache(capacity, 1, lru_fraction=lru_fraction, ghost_factor=ghost)
    for b in batches:
        uniq, counts, _ = unique_counts(_u(b))
        if len(uniq) > capacity:
            with pytest.raises(CacheBudgetError):
                fast.visit_batch(uniq, counts)
            return
        n_hit = fast.visit_batch(uniq, counts)
        _, hit = slow.lookup(uniq, pin=True, counts=counts)
        miss = ~hit
        slow.put(uniq[miss], np.zeros((int(miss.sum()), 1), np.float32), pin=True, freq=counts[miss])
        slow.unpin(uniq)
        assert n_hit == int(hit.sum())
    a, b = fast.stats(), slow.stats()
    assert (a.hits, a.misses, a.inserted, a.evicted, a.size) == (b.hits, b.misses, b.inserted, b.evicted, b.size)
    ea, eb = fast.evict_all(), slow.evict_all()   # eviction order exposes the whole LRU/LFU state
    assert ea.keys.tolist() == eb.keys.tolist() and ea.freq.tolist() == eb.freq.tolist()


def test_replay_policies():
    rng = np.random.default_rng(1)
    batches = [rng.zipf(1.3, 300).astype(np.uint64) for _ in range(60)]
    res = {p: replay(batches, 400, p) for p in ("lru", "lfu", "lru+lfu")}
    for r in res.values():
        assert r["hits"] + r["misses"] == sum(len(np.unique(b)) for b in batches)
        assert r["per_batch"].shape == (60,)
        assert 0 < r["hit_rate"] < 1
    assert res["lru+lfu"]["hit_rate"] >= res["lru"]["hit_rate"]
    with pytest.raises(InvalidInputError):
        replay(batches, 10, "fifo")
    with pytest.raises(CacheBudgetError):
        replay(batches, 10, "lru")  # a batch's working set does not fit


def test_high_frequencies_compare_by_power_of_two_classes():
    """Frequencies from 64 up are ordered by class (one per power of two, one for >= 2**23); the
    victim among equals is the row that entered the LFU part first."""
    rng = np.random.default_rng(3)
    c = RowCache(5, 1, lru_fraction=0.0, ghost_factor=0)
    ref = RefCache(5, 0)
    for step in range(300):
        keys = rng.integers(0, 12, rng.integers(1, 4)).tolist()
        freq = rng.choice([1, 63, 64, 100, 127, 128, 5000, 2**23 - 1, 2**23, 2**40], len(keys)).tolist()
        r = np.zeros((len(keys), 1))
        _same_evicted(c.put(_u(keys), r, freq=np.array(freq)),
                      ref.put(keys, r, [False] * len(keys), False, freq))


def test_take_refuses_bad_out_and_at_before_anything_moves():
    """``take``'s kernels check no bounds: a row of ``at`` outside ``out``, or an ``out`` of another
    dtype or width, is refused first, and the cached rows stay."""
    cache = RowCache(8, W)
    cache.put(_u([1, 2]), np.ones((2, W), cache.dtype))
    out = np.zeros((4, W), cache.dtype)
    with pytest.raises(InvalidInputError, match="at must be"):
        cache.take(_u([1, 2]), out, np.array([0, 4]))
    with pytest.raises(InvalidTypeError):
        cache.take(_u([1, 2]), np.zeros((4, W), np.float64), np.array([0, 1]))
    with pytest.raises(InvalidInputError, match="out must be"):
        cache.take(_u([1, 2]), np.zeros((4, W + 1), cache.dtype), np.array([0, 1]))
    assert cache.contains(_u([1, 2])).all()
    assert not hasattr(cache, "take_checked")
    _, hit = cache.take(_u([1, 2]), out, np.array([3, 0]))
    assert hit.all() and (out[[3, 0]] == 1).all() and not cache.contains(_u([1, 2])).any()


def test_a_growth_the_system_refuses_leaves_the_cache_as_it_was(monkeypatch):
    """Growing past the reservation maps every array anew; when the system refuses one of them (here the
    key map's values, the last taken, after the per-slot arrays, the ghost table and the key map were
    already moved) the call raises CacheBudgetError and every array is as it was: the cache then behaves
    as one that never tried, and grows when the memory comes back."""
    rng = np.random.default_rng(5)
    with mock.patch.object(_cache, "INITIAL_SLOTS", 64):
        a, b = RowCache(256, W, ghost_factor=2.0), RowCache(256, W, ghost_factor=2.0)
    keys = rng.permutation(4000).astype(np.uint64)
    rows = rng.random((4000, W), dtype=np.float32)
    for c in (a, b):
        c.put(keys[:64], rows[:64])
        c.set_capacity(1024)                    # past the reservation of 256: growth maps anew
    mvals = a._s._res["mvals"]
    real_view = mvals.view

    def refused(n, limit=None):
        if n > mvals.n:
            raise OSError(12, "Cannot allocate memory")
        return real_view(n, limit)

    monkeypatch.setattr(mvals, "view", refused)
    with pytest.raises(CacheBudgetError, match="the cache is as it was"):
        a.put(keys[64:300], rows[64:300])
    s = a._s
    assert s.n == 64 and len(a) == 64 and s.n_free == 0
    assert {getattr(s, name).shape[0] for name in ("skey", "dirty", "pins", "freq", "where", "stamp", "prev",
                                                   "nxt", "bkt", "rows", "free")} == {64}
    assert s.ghost.shape[0] == b._s.ghost.shape[0] and s.mkeys.shape[0] == s.mvals.shape[0] == b._s.mkeys.shape[0]
    got, found = a.peek(keys[:64])
    assert found.all()
    np.testing.assert_array_equal(got, rows[:64])
    monkeypatch.undo()
    for lo, hi in ((64, 300), (300, 900), (900, 1700), (1700, 2500), (2500, 3300), (3300, 4000)):   # grows, then evicts, as b does
        ea, eb = a.put(keys[lo:hi], rows[lo:hi], dirty=True), b.put(keys[lo:hi], rows[lo:hi], dirty=True)
        np.testing.assert_array_equal(ea.keys, eb.keys)
        np.testing.assert_array_equal(ea.rows, eb.rows)
    assert a._s.n == b._s.n == 1024
    got_a, found_a = a.peek(keys)
    got_b, found_b = b.peek(keys)
    np.testing.assert_array_equal(found_a, found_b)
    np.testing.assert_array_equal(got_a, got_b)
