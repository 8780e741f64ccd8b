"""Reference HET protocol (seed 001, Algorithms 1-3), serial and by the book: dicts, one key at a
time, float64 rows, plain SGD (``w -= lr g``) for the owner's row optimizer and the local step.

It follows the protocol of ``hps/train/_het.py`` as documented there, one iteration (global
mini-batch) at a time, the workers in rank order:

1. every worker reads ``c_g`` of its keys (a snapshot taken before anything of the iteration);
2. ``Read`` (Algorithm 2): own keys are fetched; a cached key is valid iff ``c_c <= c_s + s`` and
   ``c_c >= c_g - s`` (CheckValid); an invalid entry is evicted (its gradient pushed if ``c_c > c_s``)
   and fetched again; a missing key is fetched;
3. the owners apply every invalidation push (gradients of a key summed in rank order, one step,
   ``c_g = max(c_g, c_c)``), then serve the fetches: ``c_s = c_c = c_g``;
4. ``Write`` (Algorithm 3): each cached key takes the local step, accumulates its gradient,
   ``c_c += 1``, ``uses += 1``, ``last = tick`` (the worker's iteration count); own keys push
   ``c_c = c_s + 1`` at once; then ``Evict()``: the written entries with ``c_c > c_s + s``, then while
   the cache holds more than ``capacity`` entries the victim with the smallest ``(uses, last, key)``
   (lfu) or ``(last, key)`` (lru);
5. the owners apply the pushes of step 4 like those of step 3.

``flush()`` pushes every entry of every worker (a consistent cut).
"""

from __future__ import annotations

import numpy as np


class Entry:
    def __init__(self, row, clock):
        self.row = row.copy()
        self.grad = np.zeros_like(row)
        self.cs = self.cc = clock
        self.uses = self.last = 0


class RefHet:
    """``n`` workers (also the owners: key k belongs to ``owner(k)``), staleness ``s``, ``capacity``
    entries per worker, ``policy`` lfu | lru, SGD step ``lr``, rows of ``P`` values born as
    ``init(key)``."""

    def __init__(self, n, s, capacity, policy, lr, P, owner, init):
        self.n, self.s, self.capacity, self.policy, self.lr, self.P = n, s, capacity, policy, lr, P
        self.owner, self.init = owner, init
        self.rows, self.c_g = {}, {}
        self.caches = [dict() for _ in range(n)]
        self.ticks = [0] * n
        self.stats = [dict(hits=0, misses=0, invalidations=0, pushes=0, evictions=0) for _ in range(n)]

    def row(self, k):
        if k not in self.rows:
            self.rows[k] = np.asarray(self.init(k), np.float64)
        return self.rows[k]

    def _apply(self, pushes):
        """pushes: [(rank, key, c_c, grad)] in rank order."""
        total, clock = {}, {}
        for _, k, cc, g in pushes:
            total[k] = total[k] + g if k in total else g.copy()
            clock[k] = max(clock.get(k, 0), cc)
        for k, g in total.items():
            self.rows[k] = self.row(k) - self.lr * g
            self.c_g[k] = max(self.c_g.get(k, 0), clock[k])

    def _evict(self, r, k, out):
        e = self.caches[r].pop(k)
        if e.cc > e.cs:
            out.append((r, k, e.cc, e.grad.copy()))
            self.stats[r]["pushes"] += 1

    def iteration(self, keys, grad_fn):
        """``keys[r]``: the distinct keys (ints) worker r reads; ``grad_fn(r, k, params) -> (P,)``.
        Returns per worker ``{key: (params read, "hit" | "fetch")}`` and the valid hits' clocks
        ``{key: [(rank, c_s, c_c)]}`` with the snapshot ``c_g``."""
        s, snap = self.s, dict(self.c_g)
        fetch, pushes, seen, hits = [], [], [{} for _ in range(self.n)], {}
        for r in range(self.n):
            for k in keys[r]:
                cache = self.caches[r]
                if self.owner(k) != r and k in cache:
                    e = cache[k]
                    if e.cc <= e.cs + s and e.cc >= snap.get(k, 0) - s:
                        seen[r][k] = (e.row[:self.P].copy(), "hit")
                        hits.setdefault(k, []).append((r, e.cs, e.cc))
                        self.stats[r]["hits"] += 1
                        continue
                    self.stats[r]["invalidations"] += 1
                    self._evict(r, k, pushes)
                elif self.owner(k) != r:
                    self.stats[r]["misses"] += 1
                fetch.append((r, k))
        self._apply(pushes)
        own_clock = {}
        for r, k in fetch:
            clock = self.c_g.get(k, 0)
            seen[r][k] = (self.row(k).copy(), "fetch")
            if self.owner(k) != r:
                self.caches[r][k] = Entry(self.row(k), clock)
            else:
                own_clock[(r, k)] = clock
        pushes = []
        for r in range(self.n):
            self.ticks[r] += 1
            cache, written = self.caches[r], []
            for k in keys[r]:
                g = np.asarray(grad_fn(r, k, seen[r][k][0]), np.float64)
                if self.owner(k) == r:
                    pushes.append((r, k, own_clock[(r, k)] + 1, g))
                    continue
                e = cache[k]
                e.row = e.row - self.lr * g
                e.grad = e.grad + g
                e.cc += 1
                e.uses += 1
                e.last = self.ticks[r]
                written.append(k)
            for k in written:
                if cache[k].cc > cache[k].cs + s:
                    self._evict(r, k, pushes)
            while len(cache) > self.capacity:
                if self.policy == "lfu":
                    victim = min(cache, key=lambda k: (cache[k].uses, cache[k].last, k))
                else:
                    victim = min(cache, key=lambda k: (cache[k].last, k))
                self.stats[r]["evictions"] += 1
                self._evict(r, victim, pushes)
        self._apply(sorted(pushes, key=lambda p: p[0]))
        return seen, hits, snap

    def flush(self):
        pushes = []
        for r in range(self.n):
            for k in list(self.caches[r]):
                self._evict(r, k, pushes)
            self.ticks[r] = 0
        self._apply(pushes)
