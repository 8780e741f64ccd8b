"""The CUDA table as the HBM-PS cache (``hps/table/_cache.py``) under the simulator: the same operation
sequences as the CPU twin and the dict model end with the same victims, lookups and export; the radix
select picks exactly the n smallest ``(score, key)`` through ties; the device dedup's pieces run on
the simulated GPU."""

import numpy as np
import pytest

from hps import HashTable
from hps.gpu import missing_keys, unique_inverse
from hps.mem import unique_counts
from tests.reference.hbm_cache import ScoredDict, assert_same, random_ops, replay

pytestmark = pytest.mark.cudasim


@pytest.mark.parametrize("seed", range(4))
def test_cuda_cache_sequences_match_the_cpu_and_the_model(seed):
    ops = random_ops(seed, n_ops=30)
    want = replay(ScoredDict(3), ops)
    assert_same(replay(HashTable(8, 3, max_load_factor=0.75), ops), want)
    assert_same(replay(HashTable(8, 3, device="cuda", max_load_factor=0.75), ops), want)


@pytest.mark.parametrize("n", [1, 7, 20, 39, 40, 45])
def test_the_radix_select_takes_exactly_the_n_smallest_through_ties(n):
    """40 keys in 4 score classes of 10 (ties broken by key), chosen in the middle of a class too; n at
    or above the eligible count takes every eligible key (the path without a select)."""
    rng = np.random.default_rng(n)
    keys = rng.permutation(np.arange(1, 41, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15 % 2**40))
    t = HashTable(64, 1, device="cuda")
    t.insert(keys, np.arange(40, dtype=np.float32)[:, None])
    model = ScoredDict(1)
    model.insert(keys, np.arange(40, dtype=np.float32)[:, None])
    for b, sel in enumerate([keys[:30], keys[:20], keys[:10]]):  # classes: 3 uses, 2, 1 and 0
        t.lookup(sel, b)
        model.lookup(sel, b)
    t.lookup(keys[35:], 9)  # 5 keys protected below
    model.lookup(keys[35:], 9)
    got_k, got_r = t.evict(n, protect_from=9)
    want_k, want_r = model.evict(n, 9)
    np.testing.assert_array_equal(got_k, want_k)
    np.testing.assert_array_equal(got_r, want_r)
    assert len(t) == 40 - min(n, 35)


def test_dedup_and_misses_on_the_simulated_gpu():
    rng = np.random.default_rng(3)
    keys = rng.integers(1, 30, 200).astype(np.uint64)
    u, inv = unique_inverse(keys, np)
    hu, _, hinv = unique_counts(keys)
    np.testing.assert_array_equal(u, hu)
    np.testing.assert_array_equal(inv, hinv)
    t = HashTable(64, 2, device="cuda")
    t.insert(u[::2], np.ones((u[::2].shape[0], 2)))
    slots, misses = missing_keys(t, u, 4, np)
    np.testing.assert_array_equal(misses, u[1::2])
    assert ((slots >= 0) == np.isin(u, u[::2])).all()
    assert t.evict(100, protect_from=4)[0].shape == (0,)  # every resident key was used in batch 4
    assert t.evict(100, protect_from=5)[0].shape == (u[::2].shape[0],)
