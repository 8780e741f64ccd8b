"""The chunk-sampling estimator of the hot-set size and its Student-t interval (``seeds/003`` §4.1.2,
Eq. 1-4), and the Statistical Optimizer's threshold search (§4.1.3).

The embedding logger holds ``N_e`` entries (distinct keys of the sampled input, each with its access
count ``k``), laid out in a seeded random order and cut into ``N = N_e // m`` chunks of ``m`` entries.
``n`` chunks are drawn without replacement. For a cutoff ``H`` (Eq. 1: ``H = t * T * x / 100``, the
threshold ``t`` as a fraction of all accesses ``T`` scaled to the sampled fraction ``x``; here ``T * x
/ 100`` is the sampled accesses, counted exactly), chunk ``i`` has ``C_i`` entries with ``k >= H``
(Eq. 2); ``ybar`` and ``s`` are their mean and standard deviation (Eq. 3), and the ``100 (1 - alpha)``
% interval of the mean is ``ybar +- t_{alpha/2, n-1} sqrt((N - n) / N * s^2 / n)`` (Eq. 4, with the
finite-population correction). Scaled by ``N_e / m`` it bounds the number of hot logger entries.
The interval covers the chunk-sampling error only; the input sampler's error (a key's count in a
sample) is not in it (docs/fae.md).

When the logger has no more than ``n`` full chunks every entry is counted: the estimate is exact and
the interval has zero width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._options import CHUNK_ENTRIES, CHUNKS
from ..errors import InvalidInputError
from ._kernels import chunk_hot_counts


def t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` >= 1 degrees of freedom (Abramowitz & Stegun
    26.7.3-4, a finite sum: exact up to rounding)."""
    theta = math.atan(t / math.sqrt(df))
    c2, s = math.cos(theta) ** 2, math.sin(theta)
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(2, df - 1, 2):   # 1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2)
            term *= c2 * (k - 1) / k
            total += term
        return s * total
    if df == 1:
        return 2.0 / math.pi * theta
    term, total = 1.0, 1.0
    for k in range(3, df - 1, 2):       # 1 + 2/3 c^2 + 2*4/(3*5) c^4 + ... up to c^(df-3)
        term *= c2 * (k - 1) / k
        total += term
    return 2.0 / math.pi * (theta + s * math.cos(theta) * total)


def t_quantile(confidence: float, df: int) -> float:
    """``t_{alpha/2, df}`` with ``alpha = 1 - confidence``: the t with P(|T| <= t) = confidence
    (bisection on :func:`t_two_sided`, to 1e-12)."""
    if not 0.0 < confidence < 1.0:
        raise InvalidInputError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    lo, hi = 0.0, 1.0
    while t_two_sided(hi, df) < confidence:
        hi *= 2.0
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = 0.5 * (lo + hi)
        if t_two_sided(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Estimate:
    """Hot logger entries at ``cutoff``: ``estimate`` and the interval [``low``, ``high``] (entries)."""

    cutoff: int
    estimate: float
    low: float
    high: float


class ChunkSample:
    """The chunks drawn from the logger's ``counts`` (N_e,) int64 (Eq. 2-4). ``seed`` orders the
    logger and draws the chunks; ``n`` chunks of ``m`` entries; ``confidence`` = 1 - alpha."""

    def __init__(self, counts: np.ndarray, confidence: float, seed: int, n: int = CHUNKS, m: int = CHUNK_ENTRIES):
        if n < 2 or m < 1:
            raise InvalidInputError(f"the estimator needs at least 2 chunks of at least 1 entry, got {n} x {m}")
        counts = np.asarray(counts, dtype=np.int64)
        self.entries = int(counts.shape[0])
        self.m, self.confidence = int(m), float(confidence)
        full = self.entries // self.m
        if full <= n:  # the sample would be the whole logger: count it all
            self.exact, self.n, self.chunks = True, full, full
            self.sampled = counts.reshape(1, -1) if self.entries else np.zeros((1, 0), np.int64)
            self.t = 0.0
            return
        rng = np.random.default_rng(seed)
        perm = rng.permutation(self.entries)[:full * self.m].reshape(full, self.m)
        picked = rng.choice(full, size=n, replace=False)
        self.exact, self.n, self.chunks = False, int(n), full
        self.sampled = np.ascontiguousarray(counts[perm[picked]])   # (n, m)
        self.t = t_quantile(self.confidence, self.n - 1)

    def at(self, cutoff: int) -> Estimate:
        """The estimate and interval of hot logger entries (count >= ``cutoff``)."""
        c = chunk_hot_counts(self.sampled, np.int64(cutoff))
        if self.exact:
            v = float(c.sum())
            return Estimate(int(cutoff), v, v, v)
        ybar, s = float(c.mean()), float(c.std(ddof=1))                          # Eq. 3
        half = self.t * math.sqrt((self.chunks - self.n) / self.chunks * s * s / self.n)  # Eq. 4
        scale = self.entries / self.m
        return Estimate(int(cutoff), ybar * scale, max(0.0, (ybar - half) * scale), (ybar + half) * scale)


def search_threshold(sample: ChunkSample, budget_rows: int, max_count: int) -> Estimate:
    """Statistical Optimizer (§4.1.3): the smallest cutoff H in [1, max_count + 1] whose interval's
    upper end is at most ``budget_rows`` entries, by bisection (the estimate falls as H rises; the
    upper end is taken to fall too). ``max_count + 1`` (no entry hot) always qualifies."""
    lo, hi = 1, int(max_count) + 1
    best = sample.at(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        e = sample.at(mid)
        if e.high <= budget_rows:
            hi, best = mid, e
        else:
            lo = mid + 1
    return best if best.cutoff == hi else sample.at(hi)
