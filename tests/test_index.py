"""KeyIndex (the tiers' growable key -> int64 index) against a dict."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hps._index import KeyIndex

ops = st.lists(st.tuples(st.sampled_from(["assign", "add", "stage", "erase", "lookup", "clear"]),
                         st.lists(st.integers(0, 60), max_size=40), st.integers(-5, 5)), max_size=40)


@settings(max_examples=80, deadline=None)
@given(seq=ops)
def test_matches_dict(seq):
    ix, d = KeyIndex(width=2, capacity=4), {}
    for op, ks, v in seq:
        keys = np.array(ks, dtype=np.uint64)
        vals = np.array([[k * v, k + v] for k in ks], dtype=np.int64).reshape(-1, 2)
        if op == "assign":
            ix.assign(keys, vals)
            d.update({k: tuple(r) for k, r in zip(ks, vals.tolist())})
        elif op == "add":
            ix.add(keys, vals)
            for k, r in zip(ks, vals.tolist()):
                a, b = d.get(k, (0, 0))
                d[k] = (a + r[0], b + r[1])
        elif op == "stage":    # a two-phase assign; odd v: the index is rebuilt in between
            before = ix.lookup(keys)
            staged = ix.stage(keys)
            if v % 2:
                ix.reserve(ix.capacity + 1)
            after = ix.lookup(keys)    # staging changes nothing a reader sees
            assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])
            assert sorted(staged.order.tolist()) == list(range(len(ks)))
            order, old, had = ix.publish(staged, vals[staged.order])
            assert sorted(order.tolist()) == list(range(len(ks)))
            # equal keys keep their relative order, so applying them in ``order`` is the dict model
            for i, pos in enumerate(order.tolist()):
                k = ks[pos]
                assert had[i] == (k in d)
                if k in d:
                    assert tuple(old[i]) == d[k]
                d[k] = tuple(vals[pos].tolist())
        elif op == "erase":
            assert ix.erase(keys) == len({k for k in ks if k in d})
            for k in set(ks):
                d.pop(k, None)
        elif op == "clear":
            ix.clear()
            d.clear()
        got, found = ix.lookup(keys)
        for i, k in enumerate(ks):
            assert found[i] == (k in d)
            if k in d:
                assert tuple(got[i]) == d[k]
        assert len(ix) == len(d)
    keys, vals = ix.items()
    assert {int(k): tuple(v) for k, v in zip(keys, vals.tolist())} == d


@settings(max_examples=40, deadline=None)
@given(start=st.integers(0, 3000), batches=st.lists(st.integers(1, 2500), min_size=1, max_size=6),
       fresh=st.floats(0.0, 1.0))
def test_peak_bytes_bounds_what_writes_allocate(start, batches, fresh):
    """peak_bytes(n) bounds the memory the index holds while n more keys are written in batches of
    any sizes, rebuilds included: its arrays before each write plus what the write allocates (traced)."""
    import tracemalloc

    rng = np.random.default_rng(start)
    idx = KeyIndex(width=2)
    idx.assign(np.arange(start, dtype=np.uint64), np.zeros((start, 2), np.int64))
    inputs = []
    for b in batches:   # a share of each batch is new keys, the rest rewrites
        new = rng.random(b) < fresh
        keys = np.where(new, rng.integers(1 << 40, 1 << 50, b), rng.integers(0, max(start, 1), b))
        inputs.append((keys.astype(np.uint64), np.ones((b, 2), np.int64)))
    bound = idx.peak_bytes(sum(batches))
    held = []
    tracemalloc.start()
    try:
        for keys, vals in inputs:
            before, alive = tracemalloc.get_traced_memory()[0], idx.nbytes
            tracemalloc.reset_peak()
            idx.assign(keys, vals)
            held.append(alive + tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    assert max(held) <= bound + 4096     # tracemalloc counts the call's Python objects too
    assert idx.peak_bytes(0) == idx.nbytes


def test_peak_bytes_is_tight_while_rebuilds_double():
    """Calls no larger than the capacity make each rebuild exactly double the slots: the bound is
    that rebuild's old + new arrays + moved entries, what the write really takes (to 5 %: the list
    of live slots, 8 B a key, is Numba's memory, which tracemalloc does not see)."""
    import tracemalloc

    idx = KeyIndex(width=2)
    idx.assign(np.arange(10_000, dtype=np.uint64), np.zeros((10_000, 2), np.int64))
    bound = idx.peak_bytes(10_000)
    batches = [(np.arange(a, a + 1000, dtype=np.uint64), np.ones((1000, 2), np.int64))
               for a in range(10_000, 20_000, 1000)]
    tracemalloc.start()
    try:
        held = 0
        for keys, vals in batches:
            before, alive = tracemalloc.get_traced_memory()[0], idx.nbytes
            tracemalloc.reset_peak()
            idx.assign(keys, vals)
            held = max(held, alive + tracemalloc.get_traced_memory()[1] - before)
    finally:
        tracemalloc.stop()
    assert idx.capacity == 2 * 16_384 and 0.95 * bound <= held <= bound + 4096


def test_tombstones_rebuild_the_index_in_place_instead_of_growing_it():
    """Keys that come and go (the trainer's residency index: each batch assigns its keys and erases
    those that left) fill the table with tombstones; a rebuild drops them at the same size."""
    idx = KeyIndex(width=1)
    for b in range(200):
        keys = np.arange(b * 300, b * 300 + 300, dtype=np.uint64)
        idx.assign(keys, np.zeros(300, np.int64))
        if b >= 2:
            idx.erase(keys - 600)
    assert len(idx) == 600 and idx.capacity <= 2048   # 900 keys at once at most (load <= 0.5)
