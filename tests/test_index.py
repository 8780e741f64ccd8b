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
