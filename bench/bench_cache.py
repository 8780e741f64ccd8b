"""MEM-PS cache policy: hit rate of ``hps.mem.replay`` on Zipf traces beside Belady's optimum.

Run: ``pytest bench/bench_cache.py --benchmark-only`` (prints a table at the end; figures also go
to ``benchmark.extra_info``). ``HPS_BENCH_CACHE_BATCHES`` shrinks the trace for a quick look.

Workload (shared defaults below): ``N_KEYS`` distinct keys with Zipf(alpha) popularity over a random
popularity order; ``N_BATCHES`` batches of ``BATCH_DRAWS`` draws; each batch is de-duplicated and
its distinct keys must all be cached (pinned) while it runs. Hit rate = distinct keys of a batch
already cached when the batch starts / distinct keys of the batch, over the whole trace.

Peers in the same run, on the same access sequence:
- ``belady``: the offline optimum for batch-granular access (evict the cached key not in the current
  batch whose next use is farthest), computed here with Numba.
- ``lru`` / ``lfu``: plain LRU, and LFU with frequencies counted while cached.

Same memory for every policy: ``lru+lfu`` keeps a ghost frequency table (16 B a cell,
``DEFAULT_GHOST_FACTOR`` cells per cached row rounded up to a power of two: 64-128 B a row) that
the plain policies do not have. Each case gives every policy the same bytes, rows of ``ROW_BYTES``
(hps's default row: embedding 16 + Adagrad accumulator 16, float32) plus its ghost table, at two
levels (``memory``): ``budget`` = ``cache_frac * N_KEYS`` rows, so lru+lfu holds fewer rows to pay
for its ghost table; ``budget+ghost`` = that plus lru+lfu's ghost table at those rows, so lru+lfu
holds ``cache_frac * N_KEYS`` rows and the plain policies get the ghost table's bytes as extra rows.
Per-slot bookkeeping (key, links, counters: the same for every policy) is counted in neither.
Belady gets the same bytes as rows. Targets: lru+lfu >= 0.85 x Belady at alpha 1.0 with a 10 %
cache, never below plain LRU; cache throughput >= 5 M keys/s (draws replayed per second).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from numba import njit

from hps._hashing import mix64
from hps.mem import POLICIES as POLICY_SETTINGS
from hps.mem import RowCache, replay

N_KEYS = 200_000
BATCH_DRAWS = 4096
N_BATCHES = int(os.environ.get("HPS_BENCH_CACHE_BATCHES", "1500"))
ALPHAS = (0.8, 1.0, 1.2)
CACHE_FRACTIONS = (0.02, 0.10)
POLICIES = ("lru+lfu", "lru", "lfu")
MEMORY = ("budget", "budget+ghost")
ROW_BYTES = int(os.environ.get("HPS_BENCH_CACHE_ROW_BYTES", "128"))
ROUNDS = int(os.environ.get("HPS_BENCH_CACHE_ROUNDS", "5"))  # keys/s from the fastest round
SEED = 2024

_TRACES: dict = {}
_BELADY: dict = {}


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


def ghost_bytes(policy: str, rows: int) -> int:
    """Bytes of the ghost table a RowCache of ``rows`` rows playing ``policy`` holds beside its rows."""
    lru_fraction, ghost_factor = POLICY_SETTINGS[policy]
    return RowCache(max(rows, 1), 1, lru_fraction=lru_fraction, ghost_factor=ghost_factor).ghost_bytes


def rows_within(policy: str, memory_bytes: int) -> int:
    """Most rows r with r * ROW_BYTES + ghost_bytes(policy, r) <= memory_bytes (the ghost table
    grows with r in power-of-two steps, so bisect)."""
    lo, hi = 0, memory_bytes // ROW_BYTES
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if mid * ROW_BYTES + ghost_bytes(policy, mid) <= memory_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo


def memory_of(cache_frac: float, memory: str) -> int:
    """Bytes every policy gets at this memory level (see the module docstring)."""
    rows = int(cache_frac * N_KEYS)
    extra = ghost_bytes("lru+lfu", rows) if memory == "budget+ghost" else 0
    return rows * ROW_BYTES + extra


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("memory", MEMORY, ids=lambda v: f"memory={v}")
@pytest.mark.parametrize("cache_frac", CACHE_FRACTIONS, ids=lambda v: f"cache={v:.0%}")
@pytest.mark.parametrize("alpha", ALPHAS, ids=lambda v: f"alpha={v}")
def test_replay_hit_rate(benchmark, record, alpha, cache_frac, memory, policy):
    _, keys = zipf_trace(alpha)
    mem = memory_of(cache_frac, memory)
    capacity = rows_within(policy, mem)
    opt = belady(alpha, mem // ROW_BYTES)
    biggest = max(np.unique(batch).size for batch in keys)
    if capacity < biggest:  # a batch's distinct keys are pinned together: the cache cannot run the trace
        pytest.skip(f"{policy} holds {capacity} rows in {mem} B, fewer than a batch's {biggest} distinct keys")
    replay(keys[:4], capacity, policy)  # compile outside the timing
    result = {}

    def run():
        result.update(replay(keys, capacity, policy))

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    rate = result["hit_rate"]
    draws = N_BATCHES * BATCH_DRAWS
    record(alpha=alpha, cache_frac=cache_frac, memory=memory, memory_bytes=mem, policy=policy, rows=capacity,
           ghost_bytes=ghost_bytes(policy, capacity), hit_rate=rate, belady=opt, of_belady=rate / opt,
           keys_per_s=draws / benchmark.stats.stats.min)


def summary_lines(figures: list) -> list:
    """The comparison table of the replay cases of this run (printed by bench/conftest.py)."""
    by = {(r["alpha"], r["cache_frac"], r["memory"], r["policy"]): r for r in figures}
    out = [f"Zipf replay: {N_KEYS} keys, {N_BATCHES} batches x {BATCH_DRAWS} draws (hit rate over distinct "
           f"keys); rows of {ROW_BYTES} B; every policy gets the same bytes (rows + ghost table):",
           "  memory 'budget' = cache x N_KEYS rows; 'budget+ghost' = that plus lru+lfu's ghost table at "
           "those rows (what only lru+lfu had before)"]
    head = f"{'memory':>12} {'alpha':>5} {'cache':>6} {'belady':>7}"
    out.append(head + "".join(f" {p + ' rows':>13} {'hit':>6} {'/opt':>5} {'Mk/s':>6}" for p in POLICIES))
    for m in MEMORY:
        for a in ALPHAS:
            for f in CACHE_FRACTIONS:
                rows = [by.get((a, f, m, p)) for p in POLICIES]
                some = next((r for r in rows if r), None)
                if some is None:
                    continue
                line = f"{m:>12} {a:>5} {f:>6.0%} {some['belady']:>7.4f}"
                for r in rows:
                    line += (f" {r['rows']:>13} {r['hit_rate']:>6.4f} {r['of_belady']:>5.3f} "
                             f"{r['keys_per_s'] / 1e6:>6.2f}" if r else f" {'-':>13} {'-':>6} {'-':>5} {'-':>6}")
                out.append(line)
    return out
