"""``hps.mem.unique_counts`` (the host's dedup: prepare plans, MEM-PS pulls) against a NumPy reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.mem import unique_counts


def reference(keys):
    """(distinct keys in first-occurrence order, their counts, the inverse) with np.unique."""
    u, first, inv, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return u[order], counts[order], rank[inv.ravel()]


def check(keys):
    keys = np.asarray(keys, dtype=np.uint64)
    u, c, inv = unique_counts(keys)
    ru, rc, rinv = reference(keys)
    assert u.dtype == np.uint64 and c.dtype == np.int64 and inv.dtype == np.int64
    np.testing.assert_array_equal(u, ru)
    np.testing.assert_array_equal(c, rc)
    np.testing.assert_array_equal(inv, rinv)


@pytest.mark.parametrize("keys", [[], [7], [0], [3] * 1000, [5, 3, 5, 5, 7, 3]], ids=["empty", "one", "zero", "all-dup", "small"])
def test_edge_cases(keys):
    check(keys)


def test_all_ones_is_a_key():
    """The all-ones key (the tables' EMPTY_KEY) is counted like any other: the table holds indices,
    not keys, so no key value is a sentinel."""
    e = np.uint64(0xFFFFFFFFFFFFFFFF)
    check([e, 1, e, 2, 1, e])
    check([e])


@pytest.mark.parametrize("n, vocab", [(100_000, 30_000), (300_000, 10 ** 12), (70_000, 3)])
def test_large_batches(n, vocab):
    """Past the prefetch distance and many probes long: mini-batch and union shapes."""
    rng = np.random.default_rng(n)
    check(rng.integers(0, vocab, size=n, dtype=np.uint64))


def test_colliding_keys():
    """Keys of one home cell (the low hash bits alike) chain through long probe runs."""
    from hps._hashing import mix64
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2 ** 63, size=200_000, dtype=np.uint64)
    h = np.array([mix64(k) for k in keys[:20_000]], dtype=np.uint64)
    same = keys[:20_000][(h & np.uint64(0xFF)) == h[0] & np.uint64(0xFF)]
    check(np.concatenate([same, same[::-1], keys[:500]]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2 ** 64 - 1) | st.integers(0, 9), max_size=60))
def test_matches_numpy(keys):
    check(keys)
