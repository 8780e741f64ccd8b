"""Synthetic CTR data with Zipf feature popularity and a planted logistic ground truth.

Example generation (all vectorised, batch by batch):

- field f (0..fields-1) draws a value of popularity rank k in [0, vocab_per_field) with
  P(k) ∝ 1 / (k + 1) ** zipf (bounded Zipf; zipf = 0 is uniform). Inverse CDF on a precomputed
  cumulative table of the first ``ZIPF_TABLE_MAX`` ranks; rarer ranks of a bigger vocabulary follow
  the continuous approximation of the same law, inverted in closed form (bounded memory for any
  vocabulary). Key: ``make_keys(f, k)``.
- ``drift`` (default 0) makes popularity drift: the value of rank k in a training block whose first
  row is r is k + floor(drift * r), so the popular values (and keys) of the stream keep changing and
  old ones fall out of use; the eval split uses the shift of the end of the training split,
  floor(drift * rows), i.e. today's popular values.
- ``n_dense`` dense features ~ N(0, 1).
- true logit = bias + a_s * Σ_f z(key_f) + a_d * (dense · w_dense), with z(key) a standard normal
  derived by hashing the key with the seed (so it needs no table), w_dense ~ N(0, 1) from the seed.
  a_s, a_d scale the sparse and dense parts to standard deviations LOGIT_STD * sqrt(share) and the
  bias gives a POSITIVE_RATE share of positives; both are fitted on a calibration sample.
  LOGIT_STD = 1.25 puts the Bayes AUC near 0.78.
- label ~ Bernoulli(sigmoid(true logit)).

Block b of a stream (``block_rows`` examples, by default the batch size) uses the random generator
seeded with (seed, stream, b): any block can be made again on its own. Training, eval and
calibration examples come from different streams. ``shard=(s, K)`` keeps only rows
``share_bounds(rows, s, K)`` of each split (the blocks they overlap are generated whole), so the
shards of a split, one after the other, are exactly its rows.

Thread-safe for concurrent iterations (no mutable state besides the cached ``bayes_auc``).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..errors import InvalidInputError
from ..metrics import auc
from ._batch import Batch, check_n_fields, make_keys
from ._chunks import ReaderStats, Rebatcher, check_common
from ._shards import share_bounds

#: Ranks sampled exactly from a cumulative table (float64: 8 MiB); rarer ones from the continuous law.
ZIPF_TABLE_MAX = 1 << 20
#: Standard deviation of the true logit before the bias (sets the Bayes AUC, ~0.78).
LOGIT_STD = 1.25
#: Share of the logit variance carried by the sparse features when there are dense ones.
SPARSE_SHARE = 0.8
#: Target share of positive labels.
POSITIVE_RATE = 0.25
#: Examples of the calibration sample.
CALIBRATION_ROWS = 1 << 15
# Random streams (never renumber: they define the data of a seed).
_TRAIN, _EVAL, _CALIB, _DENSE_W = 0, 1, 2, 3
# Salt mixed into keys for the planted weights.
_WEIGHT_SALT = np.uint64(0xD6E8FEB86659FD93)
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


class SyntheticData:
    """Synthetic CTR dataset; see the module docstring for the law.

    rows: training examples; fields: categorical fields (one key each); vocab_per_field: values per
    field; zipf: popularity exponent (>= 0); n_dense: dense features; seed; batch_size: examples per
    batch yielded; shard=(index, n_shards): keep only that contiguous share of the rows of each split;
    eval_rows: examples of the eval split (default rows // 10, at least 1); block_rows: examples per
    generated block (default batch_size; the data of a seed depends on it, not on the shards);
    drift: popularity ranks shifted per example (see the module docstring).
    """

    def __init__(self, rows: int = 200_000, fields: int = 8, vocab_per_field: int = 10_000,
                 zipf: float = 1.1, n_dense: int = 4, seed: int = 0, batch_size: int = 4096,
                 shard=(0, 1), eval_rows: int | None = None, block_rows: int | None = None,
                 drift: float = 0.0):
        self.shard, self.n_shards = check_common(batch_size, shard)
        self.block_rows = int(batch_size if block_rows is None else block_rows)
        if self.block_rows < 1:
            raise InvalidInputError(f"block_rows must be >= 1, got {block_rows}")
        if not drift >= 0:
            raise InvalidInputError(f"synthetic drift must be >= 0, got {drift}")
        self.drift = float(drift)
        if rows < 0 or fields < 1 or vocab_per_field < 1 or n_dense < 0 or not zipf >= 0 \
                or seed < 0:
            raise InvalidInputError(
                f"synthetic data needs rows >= 0, fields >= 1, vocab_per_field >= 1, zipf >= 0, "
                f"n_dense >= 0, seed >= 0; got rows={rows}, fields={fields}, vocab_per_field={vocab_per_field}, "
                f"zipf={zipf}, n_dense={n_dense}, seed={seed}")
        check_n_fields(fields, "synthetic fields")
        self.rows, self.fields, self.vocab_per_field = int(rows), int(fields), int(vocab_per_field)
        self.zipf, self.n_dense, self.seed = float(zipf), int(n_dense), int(seed)
        self.batch_size = int(batch_size)
        self.eval_rows = max(1, self.rows // 10) if eval_rows is None else int(eval_rows)
        self.n_fields = self.fields
        self.stats = ReaderStats()
        self._zipf = _Zipf(self.vocab_per_field, self.zipf)
        self._field_ids = np.arange(self.fields, dtype=np.int32)
        self._w_dense = np.random.default_rng([self.seed, _DENSE_W]).standard_normal(self.n_dense)
        self._a_s, self._a_d, self._bias = 1.0, 1.0, 0.0
        self._calibrate()
        self._bayes_auc: float | None = None

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

    def _stream(self, stream: int, rows: int, start_batch: int) -> Iterator[Batch]:
        """This shard's rows of a split, in batches of ``batch_size``, from ``start_batch`` on."""
        a, b = share_bounds(rows, self.shard, self.n_shards)
        blk = self.block_rows
        reb = Rebatcher(self.batch_size)
        first = a + start_batch * self.batch_size  # earlier batches are not generated at all
        for k in range(first // blk, -(-b // blk)):
            lo, hi = k * blk, min(rows, (k + 1) * blk)
            if max(first, lo) >= min(b, hi):
                continue
            batch, _ = self._generate(stream, k, hi - lo)
            part = batch.slice(max(first, lo) - lo, min(b, hi) - lo)
            if stream == _TRAIN:
                self.stats.lines += len(part)
                self.stats.examples += len(part)
            yield from reb.push(part)
        yield from reb.flush()

    # --- public -------------------------------------------------------------------------------
    @property
    def n_batches(self) -> int:
        """Training batches of one pass over this shard."""
        a, b = share_bounds(self.rows, self.shard, self.n_shards)
        return -(-(b - a) // self.batch_size)

    def batches(self, start_batch: int = 0) -> Iterator[Batch]:
        """This shard's training batches start_batch, start_batch + 1, …; resets ``stats``."""
        self.stats = ReaderStats()
        return self._stream(_TRAIN, self.rows, start_batch)

    def probe(self) -> ReaderStats:
        """Nothing to check before a job (generated data is never malformed); empty counters."""
        return ReaderStats()

    def eval_batches(self) -> Iterator[Batch]:
        """This shard's batches of the eval split (``eval_rows`` examples, its own random stream)."""
        return self._stream(_EVAL, self.eval_rows, 0)

    def true_probs(self, block: int, eval: bool = False) -> np.ndarray:
        """True click probabilities (n,) float64 of a whole generated block (train or eval split)."""
        rows = self.eval_rows if eval else self.rows
        n = min(self.block_rows, rows - block * self.block_rows)
        if n <= 0:
            raise InvalidInputError(f"block {block} is past the end of the split")
        return self._generate(_EVAL if eval else _TRAIN, block, n)[1]

    def bayes_auc(self) -> float:
        """AUC of the true probabilities on the whole eval split: the best any model can reach."""
        if self._bayes_auc is None:
            labels, probs = [], []
            for b in range(-(-self.eval_rows // self.block_rows)):
                n = min(self.block_rows, self.eval_rows - b * self.block_rows)
                batch, p = self._generate(_EVAL, b, n)
                labels.append(batch.labels)
                probs.append(p)
            self._bayes_auc = auc(np.concatenate(labels), np.concatenate(probs))
        return self._bayes_auc
