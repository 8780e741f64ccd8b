"""The HET protocol (``hps/train/_het.py``: HetCache on every rank, HetOwner on every owner) against
the serial reference of Algorithms 1-3 (``tests/reference/het.py``) on random traces of simulated
ranks in one process, the messages routed the way ``_het_sync.HetSync`` routes them; and Lemma 1."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.errors import InvalidInputError
from hps.model import make_sparse_optimizer
from hps.train._het import HetCache, HetOwner, Pushes, cache_entries, entry_bytes
from tests.reference.het import RefHet

P, LR = 3, 0.1


def owner_of(k, n):
    return (int(k) * 2654435761 >> 7) % n


def init(k):
    return np.array([(k % 7) / 7.0, (k % 5) / 5.0 - 0.5, 0.25], np.float64)


def grad(r, k, params, it):
    """A gradient that depends on the parameters read (so a wrong read changes everything after)."""
    return 0.5 * np.asarray(params, np.float64) + np.array([r + 1, k % 3, it % 4], np.float64) * 0.01


class DictStore:
    """An owner's rows (``update_owned`` of ParameterHierarchy): keys in ``unplaced`` are resident
    for a batch prepared ahead, so updates skip them until the next iteration places them."""

    def __init__(self):
        self.rows, self.unplaced = {}, set()

    def read(self, keys):
        return np.array([self.rows.setdefault(int(k), init(int(k)).astype(np.float32)) for k in keys],
                        np.float32).reshape(len(keys), P)

    def update_owned(self, keys, update):
        done = np.array([int(k) not in self.unplaced for k in keys], np.bool_)
        sel = np.flatnonzero(done)
        new = update(sel, self.read(keys[sel]))
        for k, row in zip(keys[sel], new):
            self.rows[int(k)] = row
        return done


class Sim:
    """``n`` simulated ranks of the library protocol, one HetSync step per :meth:`iteration`."""

    def __init__(self, n, s, capacity, policy, rng):
        opt = make_sparse_optimizer("sgd", LR)
        self.n, self.rng = n, rng
        self.caches = [HetCache(capacity, P, P, s, policy, opt) for _ in range(n)]
        self.owners = [HetOwner(opt, P) for _ in range(n)]
        self.stores = [DictStore() for _ in range(n)]

    def owner(self, keys):
        return np.array([owner_of(k, self.n) for k in keys], np.int64)

    def route(self, pushes, asked=()):
        """Per-rank Pushes -> every owner applies what it gets, grouped by source rank. Some pushed
        rows not ``asked`` this iteration are "prepared ahead, not placed": their pushes must wait."""
        for o in range(self.n):
            parts = []
            for r in range(self.n):
                m = self.owner(pushes[r].keys) == o
                parts.append(Pushes(pushes[r].keys[m], pushes[r].clocks[m], pushes[r].grads[m]))
            both = Pushes.concat(parts)
            self.stores[o].unplaced = set(int(k) for k in both.keys[self.rng.random(len(both)) < 0.3]) - asked
            self.owners[o].apply(self.stores[o], both)

    def iteration(self, keys, it):
        n = self.n
        for o in range(n):  # every row this iteration asks for is placed now
            self.stores[o].unplaced.clear()
            asked = np.concatenate([k[self.owner(k) == o] for k in keys])
            self.owners[o].apply_pending(self.stores[o], asked)
        asked = set(int(x) for k in keys for x in k)
        reads, valid_clocks = [], {}
        for r in range(n):
            k = keys[r]
            own = self.owner(k)
            c_g = np.array([self.owners[o].clocks(np.array([x], np.uint64))[0] for x, o in zip(k, own)], np.int64)
            slots, fetch, inv = self.caches[r].read(k, c_g, own != r)
            for x, sl, cg in zip(k, slots, c_g):
                if sl >= 0:
                    c = self.caches[r]
                    valid_clocks.setdefault(int(x), []).append((r, int(c.cs[sl]), int(c.cc[sl]), int(cg)))
            reads.append((slots, fetch, inv))
        self.route([inv for _, _, inv in reads], asked)
        out, end = [], []
        for r in range(n):
            k, (slots, fetch, _) = keys[r], reads[r]
            own = self.owner(k)
            params = np.empty((k.shape[0], P), np.float32)
            clock = np.zeros(k.shape[0], np.int64)
            for i in np.flatnonzero(fetch):
                o = own[i]
                params[i] = self.stores[o].read(k[i:i + 1])[0]
                clock[i] = self.owners[o].clocks(k[i:i + 1])[0]
            params[~fetch] = self.caches[r].get(slots[~fetch])
            g = np.array([grad(r, int(x), params[i], it) for i, x in enumerate(k)], np.float32).reshape(-1, P)
            remote = own != r
            new = fetch & remote
            slots[new] = self.caches[r].insert(k[new], params[new], clock[new])
            mine = Pushes(k[~remote], clock[~remote] + 1, g[~remote])
            end.append(Pushes.concat([mine, self.caches[r].write(slots[remote], g[remote])]))
            out.append({int(x): (params[i], "fetch" if fetch[i] else "hit") for i, x in enumerate(k)})
        self.route(end, asked)
        return out, valid_clocks

    def flush(self):
        self.route([c.drain() for c in self.caches], set())
        for o in range(self.n):
            self.stores[o].unplaced.clear()
            self.owners[o].apply_pending(self.stores[o])


traces = st.fixed_dictionaries({
    "n": st.integers(2, 4),
    "s": st.sampled_from([0, 1, 2, 5, 1 << 60]),
    "capacity": st.integers(0, 6),
    "policy": st.sampled_from(["lfu", "lru"]),
    "seed": st.integers(0, 2**32 - 1),
    "iterations": st.integers(1, 12),
    "flush_at": st.integers(0, 12),
    "vocab": st.integers(2, 16),
})


@settings(max_examples=150, deadline=None)
@given(traces)
def test_protocol_matches_the_serial_reference_and_lemma_1(t):
    n, s, rng = t["n"], t["s"], np.random.default_rng(t["seed"])
    sim = Sim(n, s, t["capacity"], t["policy"], np.random.default_rng(t["seed"] + 1))
    ref = RefHet(n, s, t["capacity"], t["policy"], LR, P, lambda k: owner_of(k, n), init)
    for it in range(t["iterations"]):
        # Zipf-ish keys, distinct per rank (a mini-batch's unique keys)
        keys = [np.unique(np.minimum(rng.zipf(1.5, rng.integers(1, 8)), t["vocab"])).astype(np.uint64)
                for _ in range(n)]
        got, clocks = sim.iteration(keys, it)
        want, hits, snap = ref.iteration([[int(x) for x in k] for k in keys],
                                         lambda r, k, p, it=it: grad(r, k, p, it))
        for r in range(n):
            assert {k: v[1] for k, v in got[r].items()} == {k: v[1] for k, v in want[r].items()}
            for k in got[r]:
                np.testing.assert_allclose(got[r][k][0], want[r][k][0], rtol=1e-4, atol=1e-5)
        assert {k: sorted(v[:3] for v in c) for k, c in clocks.items()} == {k: sorted(c) for k, c in hits.items()}
        for k, replicas in clocks.items():  # CheckValid held for every valid read, so Lemma 1 holds
            for _, c_s, c_c, c_g in replicas:
                assert c_g - s <= c_c <= c_s + s <= c_g + s
            cc = [c for _, _, c, _ in replicas]
            assert max(cc) - min(cc) <= 2 * s
        for o in range(n):
            mine = [k for k in ref.rows if owner_of(k, n) == o]
            np.testing.assert_array_equal(sim.owners[o].clocks(np.array(mine, np.uint64)),
                                          [ref.c_g.get(k, 0) for k in mine])
        if it == t["flush_at"]:
            sim.flush()
            ref.flush()
    sim.flush()
    ref.flush()
    for o in range(n):  # the flush leaves every update at its owner and nothing pending
        assert sim.owners[o].pending == 0
        for k, row in ref.rows.items():
            if owner_of(k, n) == o:
                np.testing.assert_allclose(sim.stores[o].read([k])[0], row, rtol=1e-4, atol=1e-5)
    for r in range(n):
        st_ = sim.caches[r].stats
        assert len(sim.caches[r]) == 0
        for name in ("hits", "misses", "invalidations", "pushes", "evictions"):
            assert st_[name] == ref.stats[r][name], name


def test_s0_empties_every_cache_after_each_minibatch():
    """s = 0: every fetched entry is written once and pushed at the end of its mini-batch (BSP)."""
    sim = Sim(3, 0, 100, "lfu", np.random.default_rng(0))
    keys = [np.arange(1, 9, dtype=np.uint64)] * 3
    for it in range(3):
        got, _ = sim.iteration(keys, it)
        assert all(v[1] == "fetch" for g in got for v in g.values())
        assert all(len(c) == 0 for c in sim.caches)


def test_unbounded_staleness_keeps_hot_entries_until_evicted():
    sim = Sim(2, 1 << 60, 100, "lru", np.random.default_rng(0))
    keys = [np.arange(1, 9, dtype=np.uint64)] * 2
    sim.iteration(keys, 0)
    got, _ = sim.iteration(keys, 1)
    remote = [k for k in range(1, 9) if owner_of(k, 2) != 0]
    assert all(got[0][k][1] == "hit" for k in remote)
    assert sim.caches[0].stats["pushes"] == 0


def test_eviction_pushes_the_accumulated_gradient():
    """A capacity of 1: the second key evicts the first, whose gradient reaches the owner."""
    opt = make_sparse_optimizer("sgd", 1.0)
    cache = HetCache(1, P, P, 1 << 60, "lru", opt)
    keys = np.array([10, 11], np.uint64)
    slots = cache.insert(keys[:1], np.ones((1, P), np.float32), np.array([4]))
    assert len(cache.write(slots, np.full((1, P), 0.5, np.float32))) == 0
    slots = cache.insert(keys[1:], np.ones((1, P), np.float32), np.array([0]))
    out = cache.write(slots, np.full((1, P), 0.25, np.float32))
    assert out.keys.tolist() == [10] and out.clocks.tolist() == [5]
    np.testing.assert_array_equal(out.grads, np.full((1, P), 0.5, np.float32))
    assert len(cache) == 1 and cache.stats["evictions"] == 1


def test_cache_size_from_a_fraction_or_bytes():
    assert cache_entries(0.1, 32, 16, 10_000) == 1000
    assert cache_entries(10 * entry_bytes(32, 16), 32, 16, None) == 10
    with pytest.raises(InvalidInputError, match="64MiB"):
        cache_entries(0.1, 32, 16, None)
