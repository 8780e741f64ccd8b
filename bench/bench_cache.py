"""MEM-PS cache policy: hit rate of ``hps.mem.replay`` on Zipf traces beside Belady's optimum.

Run: ``pytest bench/bench_cache.py --benchmark-only -s`` (prints a table; figures also go to
``benchmark.extra_info``). ``HPS_BENCH_CACHE_BATCHES`` shrinks the trace for a quick look.

Workload (shared defaults below): ``N_KEYS`` distinct keys with Zipf(alpha) popularity over a random
popularity order; ``N_BATCHES`` batches of ``BATCH_DRAWS`` draws; each batch is de-duplicated and
its distinct keys must all be cached (pinned) while it runs. Hit rate = distinct keys of a batch
already cached when the batch starts / distinct keys of the batch, over the whole trace.

Peers in the same run, on the same access sequence:
- ``belady``: the offline optimum for batch-granular access (evict the cached key not in the current
  batch whose next use is farthest), computed here with Numba.
- ``lru`` / ``lfu``: plain LRU, and LFU with frequencies counted while cached.
Targets: lru+lfu >= 0.85 x Belady at alpha 1.0 with a 10 % cache, never below plain LRU; cache
throughput >= 5 M keys/s (draws replayed per second).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from numba import njit

from hps._hashing import mix64
from hps.mem import replay

N_KEYS = 200_000
BATCH_DRAWS = 4096
N_BATCHES = int(os.environ.get("HPS_BENCH_CACHE_BATCHES", "1500"))
ALPHAS = (0.8, 1.0, 1.2)
CACHE_FRACTIONS = (0.02, 0.10)
POLICIES = ("lru+lfu", "lru", "lfu")
ROUNDS = int(os.environ.get("HPS_BENCH_CACHE_ROUNDS", "5"))  # keys/s from the fastest round
SEED = 2024

_TRACES: dict = {}
_BELADY: dict = {}
_TABLE: list = []


@njit(cache=True)
def _keys_of(ids, salt):
    out = np.empty(ids.shape[0], dtype=np.uint64)
    for i in range(ids.shape[0]):
        out[i] = mix64(np.uint64(ids[i]) ^ salt) >> np.uint64(1)  # never the all-ones sentinel
    return out


def zipf_trace(alpha: float):
    """(ids (N_BATCHES, BATCH_DRAWS) int64 popularity ranks, key batches list of (BATCH_DRAWS,) uint64)."""
    if alpha not in _TRACES:
        rng = np.random.default_rng(SEED)
        p = np.arange(1, N_KEYS + 1, dtype=np.float64) ** -alpha
        cdf = np.cumsum(p / p.sum())
        ranks = np.searchsorted(cdf, rng.random((N_BATCHES, BATCH_DRAWS)), side="right")
        ranks = np.minimum(ranks, N_KEYS - 1)
        ids = rng.permutation(N_KEYS)[ranks].astype(np.int64)  # popularity order unrelated to ids
        keys = [_keys_of(row, np.uint64(SEED)) for row in ids]
        _TRACES[alpha] = (ids, keys)
    return _TRACES[alpha]


@njit(cache=True)
def _belady(ids, n_keys, capacity):
    """Batch-granular Belady. ids (B, D) int64 in [0, n_keys) -> (hits, accesses) over distinct keys."""
    n_b, d = ids.shape
    # De-duplicate each batch.
    seen = np.full(n_keys, -1, dtype=np.int64)
    flat = np.empty(n_b * d, dtype=np.int64)
    off = np.zeros(n_b + 1, dtype=np.int64)
    m = 0
    for b in range(n_b):
        for j in range(d):
            x = ids[b, j]
            if seen[x] != b:
                seen[x] = b
                flat[m] = x
                m += 1
        off[b + 1] = m
    # Next use (batch index) of each access; n_b = never.
    nxt_use = np.empty(m, dtype=np.int64)
    last = np.full(n_keys, n_b, dtype=np.int64)
    for b in range(n_b - 1, -1, -1):
        for i in range(off[b], off[b + 1]):
            nxt_use[i] = last[flat[i]]
            last[flat[i]] = b
    # Simulation with a lazy max-heap of (next use << 20 | id).
    shift = 20
    in_cache = np.zeros(n_keys, dtype=np.bool_)
    cur = np.zeros(n_keys, dtype=np.int64)
    heap = np.empty(m + 1, dtype=np.int64)
    hn = 0
    size = 0
    hits = 0
    for b in range(n_b):
        misses = 0
        for i in range(off[b], off[b + 1]):
            x = flat[i]
            if in_cache[x]:
                hits += 1
            else:
                misses += 1
            cur[x] = nxt_use[i]
        evict = size + misses - capacity
        while evict > 0:
            top = heap[0]
            hn -= 1
            last_e = heap[hn]
            p = 0
            while True:  # sift down (max-heap)
                c = 2 * p + 1
                if c >= hn:
                    break
                if c + 1 < hn and heap[c + 1] > heap[c]:
                    c += 1
                if heap[c] <= last_e:
                    break
                heap[p] = heap[c]
                p = c
            if hn > 0:
                heap[p] = last_e
            x = top & ((1 << shift) - 1)
            if in_cache[x] and cur[x] == (top >> shift):
                in_cache[x] = False
                size -= 1
                evict -= 1
        for i in range(off[b], off[b + 1]):
            x = flat[i]
            if not in_cache[x]:
                in_cache[x] = True
                size += 1
            e = (cur[x] << shift) | x
            p = hn
            hn += 1
            while p > 0:  # sift up
                q = (p - 1) >> 1
                if heap[q] >= e:
                    break
                heap[p] = heap[q]
                p = q
            heap[p] = e
    return hits, m


def belady(alpha: float, capacity: int) -> float:
    key = (alpha, capacity)
    if key not in _BELADY:
        ids, _ = zipf_trace(alpha)
        h, n = _belady(ids, N_KEYS, capacity)
        _BELADY[key] = h / n
    return _BELADY[key]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("cache_frac", CACHE_FRACTIONS)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_replay_hit_rate(benchmark, record, alpha, cache_frac, policy):
    _, keys = zipf_trace(alpha)
    capacity = int(cache_frac * N_KEYS)
    opt = belady(alpha, capacity)
    replay(keys[:4], capacity, policy)  # compile outside the timing
    result = {}

    def run():
        result.update(replay(keys, capacity, policy))

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    rate = result["hit_rate"]
    draws = N_BATCHES * BATCH_DRAWS
    figures = dict(alpha=alpha, cache_frac=cache_frac, policy=policy, hit_rate=rate, belady=opt,
                   of_belady=rate / opt, keys_per_s=draws / benchmark.stats.stats.min)
    record(**figures)
    _TABLE.append(figures)


def test_zz_print_table(benchmark):
    """Prints the comparison table of the runs above (a no-op benchmark so --benchmark-only keeps it)."""
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    if not _TABLE:
        pytest.skip("no replay results in this run")
    by = {(r["alpha"], r["cache_frac"], r["policy"]): r for r in _TABLE}
    print(f"\nZipf replay: {N_KEYS} keys, {N_BATCHES} batches x {BATCH_DRAWS} draws (hit rate over distinct keys)")
    head = f"{'alpha':>5} {'cache':>6} {'belady':>7}" + "".join(f" {p:>8} {'/opt':>5}" for p in POLICIES)
    print(head + "".join(f" {p + ' Mk/s':>12}" for p in POLICIES))
    for a in ALPHAS:
        for f in CACHE_FRACTIONS:
            rows = [by.get((a, f, p)) for p in POLICIES]
            if rows[0] is None:
                continue
            line = f"{a:>5} {f:>6.0%} {rows[0]['belady']:>7.4f}"
            for r in rows:
                line += f" {r['hit_rate']:>8.4f} {r['of_belady']:>5.3f}" if r else f" {'-':>8} {'-':>5}"
            print(line + "".join(f" {r['keys_per_s'] / 1e6:>12.2f}" if r else f" {'-':>12}" for r in rows))
