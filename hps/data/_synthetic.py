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
seeded with (seed, stream, b): any block can be made again on its own, so ``readers`` threads make
blocks in parallel (``hps.data._parallel``; one nogil kernel per block, ``_synthetic_kernels``) and
the batches are the same for any number of readers. Training, eval and
calibration examples come from different streams. ``shard=(s, K)`` keeps only rows
``share_bounds(rows, s, K)`` of each split (the blocks they overlap are generated whole), so the
shards of a split, one after the other, are exactly its rows.

``GENERATOR_VERSION`` names the data a seed gives; it changes only when that data does (the kernels
of version 1 reproduce the NumPy code of version 1 draw for draw: ``tests/reference/synthetic.py``).

Thread-safe for concurrent iterations (no mutable state besides the cached ``bayes_auc``).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..errors import InvalidInputError
from ..metrics import auc
from ._batch import FIELD_SHIFT, Batch, FixedBatch, check_n_fields, make_keys
from ._chunks import ReaderStats, Rebatcher, check_common, cut_at_batches
from ._parallel import check_readers, ordered_map
from ._shards import share_bounds
from ._synthetic_kernels import guide_table, synth_block, zipf_ranks

#: The data a seed gives (with the other parameters). Bump it when a change makes other data.
GENERATOR_VERSION = 1
#: Ranks sampled exactly from a cumulative table (float64: 8 MiB); rarer ones from the continuous law.
ZIPF_TABLE_MAX = 1 << 20
#: Most buckets of the guide table that starts each search in the cumulative table (int64: 8 MiB); a
#: power of two (the kernel relies on it: ``_synthetic_kernels.synth_block``).
GUIDE_BUCKETS = 1 << 20
#: Planted normals of the most popular ranks kept in a table, over all fields (float64: 1 MiB).
PLANTED_TABLE_ENTRIES = 1 << 17
#: Draws generated per kernel call (its scratch arrays stay in cache).
TILE_VALUES = 1 << 16
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
    h1 = _mix64(keys ^ _WEIGHT_SALT ^ _seed_mix(seed))
    h2 = _mix64(h1 ^ _WEIGHT_SALT)
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0 ** -53
    u2 = (h2 >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return _box_muller(u1, u2)


def _seed_mix(seed: int) -> np.ndarray:
    return _mix64(np.array([seed], dtype=np.uint64))


def _box_muller(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """Standard normals of uniforms u1 in (0, 1), u2 in [0, 1) (NumPy's vectorised log and cos)."""
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
        self.guide = guide_table(self.cdf, min(GUIDE_BUCKETS, 1 << (self.head - 1).bit_length())).astype(np.int32)

    def _tail_integral(self, a: float, b: float) -> float:
        if abs(self.s - 1.0) < 1e-12:
            return float(np.log(b / a))
        return float((b ** (1.0 - self.s) - a ** (1.0 - self.s)) / (1.0 - self.s))

    def ranks(self, u: np.ndarray) -> np.ndarray:
        """Ranks (m,) int64 of uniforms u (m,) float64 in [0, 1), as the generator draws them."""
        out = np.empty(u.shape[0], dtype=np.int64)
        zipf_ranks(np.ascontiguousarray(u, dtype=np.float64), self.cdf, self.guide, self.n, self.p_head,
                   self.total, self.s, out)
        return out

    def keys(self, rng, n: int, n_fields: int, drift: int, ztab: np.ndarray,
             seed: int) -> tuple[np.ndarray, np.ndarray]:
        """(keys (n, F) uint64, planted sparse logit (n,) float64) of the next n x F uniforms of
        ``rng`` (``rng.random((n, F))``, drawn a tile at a time): field f's rank of u[:, f] (shifted
        by ``drift``), its key, and the sum over the fields of the keys' planted normals of ``seed``
        (``ztab`` (F, R): those of ranks below R, see :func:`planted_table`). Blocking; thread-safe
        for different ``rng``."""
        keys = np.empty((n, n_fields), dtype=np.uint64)
        sparse = np.empty(n, dtype=np.float64)
        rows = max(1, TILE_VALUES // n_fields)  # scratch for one tile of rows, reused
        z = np.empty((rows, n_fields))
        miss, u1, u2 = np.empty(rows * n_fields, np.int64), np.empty(rows * n_fields), np.empty(rows * n_fields)
        mix = _seed_mix(seed)[0]
        for a in range(0, n, rows):
            b = min(n, a + rows)
            u = rng.random((b - a, n_fields))
            m = synth_block(u, self.cdf, self.guide, self.n, self.p_head, self.total, self.s, np.uint64(drift),
                            FIELD_SHIFT, ztab, mix, _WEIGHT_SALT, keys[a:b], z, miss, u1, u2)
            z.reshape(-1)[miss[:m]] = _box_muller(u1[:m], u2[:m])
            sparse[a:b] = z[:b - a].sum(axis=1)
        return keys, sparse


def planted_table(n_fields: int, n_ranks: int, seed: int) -> np.ndarray:
    """(n_fields, n_ranks) float64: ``planted_normal`` of the key of rank r in field f — the normals of
    the most popular keys, looked up instead of computed (the same values)."""
    field = np.repeat(np.arange(n_fields, dtype=np.int64), n_ranks)
    ranks = np.tile(np.arange(n_ranks, dtype=np.uint64), n_fields)
    return planted_normal(make_keys(field, ranks), seed).reshape(n_fields, n_ranks)


class SyntheticData:
    """Synthetic CTR dataset; see the module docstring for the law.

    rows: training examples; fields: categorical fields (one key each); vocab_per_field: values per
    field; zipf: popularity exponent (>= 0); n_dense: dense features; seed; batch_size: examples per
    batch yielded; shard=(index, n_shards): keep only that contiguous share of the rows of each split;
    eval_rows: examples of the eval split (default rows // 10, at least 1); block_rows: examples per
    generated block (default batch_size; the data of a seed depends on it, not on the shards);
    drift: popularity ranks shifted per example (see the module docstring); readers: threads making
    blocks in parallel (the same batches for any number); split: "train", or "eval" to make
    ``batches()`` stream the eval split (``python -m hps.convert --split eval``).
    """

    def __init__(self, rows: int = 200_000, fields: int = 8, vocab_per_field: int = 10_000,
                 zipf: float = 1.1, n_dense: int = 4, seed: int = 0, batch_size: int = 4096,
                 shard=(0, 1), eval_rows: int | None = None, block_rows: int | None = None,
                 drift: float = 0.0, readers: int = 1, split: str = "train"):
        self.shard, self.n_shards = check_common(batch_size, shard)
        if split not in ("train", "eval"):
            raise InvalidInputError(f"synthetic split must be train or eval, got {split!r}")
        self.split = split
        self.readers = check_readers(readers)
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
        self._ztab = planted_table(self.fields, min(self.vocab_per_field, max(1, PLANTED_TABLE_ENTRIES // self.fields)),
                                   self.seed)
        self._field_ids = np.arange(self.fields, dtype=np.int32)
        self._w_dense = np.random.default_rng([self.seed, _DENSE_W]).standard_normal(self.n_dense)
        self._a_s, self._a_d, self._bias = 1.0, 1.0, 0.0
        self._calibrate()
        self._bayes_auc: float | None = None

    # --- generation -------------------------------------------------------------------------
    def _raw(self, stream: int, b: int, n: int):
        """(examples without labels as a FixedBatch, sparse logit part, dense logit part, rng) of
        block b of a stream (n examples). Thread-safe."""
        rng = np.random.default_rng([self.seed, stream, b])
        shift = 0
        if self.drift:  # popularity drift: see the module docstring
            first_row = self.rows if stream == _EVAL else b * self.block_rows if stream == _TRAIN else 0
            shift = int(self.drift * first_row)
        keys, sparse = self._zipf.keys(rng, n, self.fields, shift, self._ztab, self.seed)
        dense = rng.standard_normal((n, self.n_dense)).astype(np.float32)
        dlogit = dense.astype(np.float64) @ self._w_dense
        return FixedBatch(np.empty(n, dtype=np.float32), dense, keys), sparse, dlogit, rng

    def _generate(self, stream: int, b: int, n: int) -> tuple[FixedBatch, np.ndarray]:
        """Block b of a stream (n examples) and its true click probabilities (n,) float64."""
        part, sparse, dlogit, rng = self._raw(stream, b, n)
        p = 1.0 / (1.0 + np.exp(-(self._bias + self._a_s * sparse + self._a_d * dlogit)))
        part.labels[:] = rng.random(n) < p
        return part, p

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

    def _stream(self, stream: int, rows: int, start_batch: int, count: bool = False) -> Iterator[Batch]:
        """This shard's rows of a split, in batches of ``batch_size``, from ``start_batch`` on: the
        blocks they overlap, generated by ``readers`` threads."""
        a, b = share_bounds(rows, self.shard, self.n_shards)
        blk = self.block_rows
        first = a + start_batch * self.batch_size  # earlier batches are not generated at all
        spans = [(k, max(first, k * blk), min(b, (k + 1) * blk, rows)) for k in range(first // blk, -(-b // blk))]
        spans = [(k, lo, hi) for k, lo, hi in spans if lo < hi]

        def work(span):  # whole batches are built here, in the readers' threads
            k, lo, hi = span
            part, _ = self._generate(stream, k, min(rows, (k + 1) * blk) - k * blk)
            return cut_at_batches(part.slice(lo - k * blk, hi - k * blk), lo - first, self.batch_size)

        reb = Rebatcher(self.batch_size)
        for pieces in ordered_map(work, spans, self.readers):
            if stream == _TRAIN or count:
                n = sum(len(p) for p in pieces)
                self.stats.lines += n
                self.stats.examples += n
            yield from reb.push(pieces)
        yield from reb.flush()

    # --- public -------------------------------------------------------------------------------
    @property
    def n_batches(self) -> int:
        """Training batches of one pass over this shard."""
        a, b = share_bounds(self.rows, self.shard, self.n_shards)
        return -(-(b - a) // self.batch_size)

    @property
    def stream_rows(self) -> int:
        """Examples of the split ``batches()`` streams (all shards)."""
        return self.eval_rows if self.split == "eval" else self.rows

    def batches(self, start_batch: int = 0) -> Iterator[Batch]:
        """This shard's training batches start_batch, start_batch + 1, … (the eval split's with
        ``split="eval"``); resets ``stats``."""
        self.stats = ReaderStats()
        if self.split == "eval":
            return self._stream(_EVAL, self.eval_rows, start_batch, count=True)
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
                part, p = self._generate(_EVAL, b, n)
                labels.append(part.labels)
                probs.append(p)
            self._bayes_auc = auc(np.concatenate(labels), np.concatenate(probs))
        return self._bayes_auc
