"""The synthetic generator as it was written first, in NumPy (a ``searchsorted`` per draw, the planted
normals as array expressions): the law that ``hps.data.SyntheticData``'s kernels must reproduce
exactly — the same keys, dense features and labels for the same seed. Tests only."""

from __future__ import annotations

import numpy as np

from hps.data import Batch, make_keys
from hps.data._synthetic import (_CALIB, _DENSE_W, _EVAL, _TRAIN, _WEIGHT_SALT, CALIBRATION_ROWS, LOGIT_STD,
                                  POSITIVE_RATE, SPARSE_SHARE, ZIPF_TABLE_MAX)

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser, vectorised (uint64 arithmetic wraps)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def planted_normal(keys: np.ndarray, seed: int) -> np.ndarray:
    """Standard normal (float64) per key, a pure function of (key, seed). keys (m,) uint64."""
    h1 = _mix64(keys ^ _WEIGHT_SALT ^ _mix64(np.array([seed], dtype=np.uint64)))
    h2 = _mix64(h1 ^ _WEIGHT_SALT)
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    u2 = (h2 >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


class _Zipf:
    """Bounded Zipf sampler over ranks [0, n): P(k) ∝ (k + 1) ** -s.

    The first ``ZIPF_TABLE_MAX`` ranks (the head) are exact: inverse CDF by binary search in a
    cumulative table. The tail beyond, if any, follows the continuous density ∝ x ** -s on
    [head + 1, n + 1), inverted in closed form (its error is negligible that far from the head)."""

    def __init__(self, n: int, s: float):
        self.n, self.s = n, s
        self.head = min(n, ZIPF_TABLE_MAX)
        cdf = np.cumsum(np.arange(1, self.head + 1, dtype=np.float64) ** -s)
        tail = self._tail_integral(self.head + 1.0, n + 1.0) if n > self.head else 0.0
        self.total = cdf[-1] + tail
        self.cdf = cdf / self.total
        self.p_head = cdf[-1] / self.total

    def _tail_integral(self, a: float, b: float) -> float:
        if abs(self.s - 1.0) < 1e-12:
            return float(np.log(b / a))
        return float((b ** (1.0 - self.s) - a ** (1.0 - self.s)) / (1.0 - self.s))

    def ranks(self, u: np.ndarray) -> np.ndarray:
        """Ranks (uint64, same shape) of uniforms u in [0, 1)."""
        k = np.searchsorted(self.cdf, u, side="right")
        if self.n > self.head:
            t = u >= self.p_head
            if t.any():  # mass m of the tail integral from a = head + 1 solves for x
                a, s = self.head + 1.0, self.s
                m = (u[t] - self.p_head) * self.total
                if abs(s - 1.0) < 1e-12:
                    x = a * np.exp(m)
                else:
                    x = (a ** (1.0 - s) + (1.0 - s) * m) ** (1.0 / (1.0 - s))
                k[t] = np.floor(x).astype(np.int64) - 1
        return np.minimum(k, self.n - 1).astype(np.uint64)


class ReferenceSynthetic:
    """The generator before its kernels (generator version 1): NumPy only."""

    def __init__(self, rows=200_000, fields=8, vocab_per_field=10_000, zipf=1.1, n_dense=4, seed=0,
                 block_rows=4096, drift=0.0):
        self.rows, self.fields, self.vocab_per_field = rows, fields, vocab_per_field
        self.zipf, self.n_dense, self.seed, self.block_rows, self.drift = zipf, n_dense, seed, block_rows, drift
        self._zipf = _Zipf(self.vocab_per_field, self.zipf)
        self._field_ids = np.arange(self.fields, dtype=np.int32)
        self._w_dense = np.random.default_rng([self.seed, _DENSE_W]).standard_normal(self.n_dense)
        self._a_s, self._a_d, self._bias = 1.0, 1.0, 0.0
        self._calibrate()

    # --- generation -------------------------------------------------------------------------
    def _raw(self, stream: int, b: int, n: int):
        """(batch without labels, sparse logit part, dense logit part, rng) of batch b of a stream."""
        rng = np.random.default_rng([self.seed, stream, b])
        ranks = self._zipf.ranks(rng.random((n, self.fields)))
        if self.drift:  # popularity drift: see the module docstring
            first_row = self.rows if stream == _EVAL else b * self.block_rows if stream == _TRAIN else 0
            ranks += np.uint64(int(self.drift * first_row))
        field = np.tile(self._field_ids, n)
        keys = make_keys(field, ranks.reshape(-1))
        sparse = planted_normal(keys, self.seed).reshape(n, self.fields).sum(axis=1)
        dense = rng.standard_normal((n, self.n_dense)).astype(np.float32)
        dlogit = dense.astype(np.float64) @ self._w_dense
        batch = Batch(np.empty(n, dtype=np.float32), dense, keys, field,
                      np.ones(n * self.fields, dtype=np.float32),
                      np.arange(0, (n + 1) * self.fields, self.fields, dtype=np.int64), self.fields)
        return batch, sparse, dlogit, rng

    def _generate(self, stream: int, b: int, n: int) -> tuple[Batch, np.ndarray]:
        """Batch b of a stream (n examples) and its true click probabilities (n,) float64."""
        batch, sparse, dlogit, rng = self._raw(stream, b, n)
        p = 1.0 / (1.0 + np.exp(-(self._bias + self._a_s * sparse + self._a_d * dlogit)))
        batch.labels[:] = rng.random(n) < p
        return batch, p

    def _calibrate(self) -> None:
        _, sparse, dlogit, _ = self._raw(_CALIB, 0, CALIBRATION_ROWS)
        share = SPARSE_SHARE if self.n_dense else 1.0
        sd_s, sd_d = float(sparse.std()), float(dlogit.std())
        self._a_s = LOGIT_STD * np.sqrt(share) / sd_s if sd_s > 0 else 0.0
        self._a_d = LOGIT_STD * np.sqrt(1.0 - share) / sd_d if sd_d > 0 else 0.0
        z = self._a_s * sparse + self._a_d * dlogit
        lo, hi = -30.0, 30.0
        for _ in range(60):  # bisection: mean sigmoid is increasing in the bias
            mid = 0.5 * (lo + hi)
            if np.mean(1.0 / (1.0 + np.exp(-(mid + z)))) > POSITIVE_RATE:
                hi = mid
            else:
                lo = mid
        self._bias = 0.5 * (lo + hi)
