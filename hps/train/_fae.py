"""FAE in the trainer (``--fae PROFILE`` / ``--fae auto --hot-bytes SIZE``; ``seeds/003`` §4.2-4.3).

- **Hot rows** (:class:`HotRows`): the profile's hot keys are pinned, on every rank, in a partition
  of HBM-PS of their own (a table on the tier's device sized for them) for the whole run: loaded
  once at the start (from their owners' MEM-PS/SSD-PS, after a resume too), never evicted, never
  fetched again. The residency window never sees them: the sparse-sync plans leave hot keys out
  (``_sync``), so neither the prepare stage nor the owner exchange touches them.
- **Classification while reading** (:meth:`Fae.split`, read stage): an example is hot iff all its keys
  are (``hps.profile.examples_all_hot``). Cold mini-batch ``j`` is the original mini-batch ``j`` minus
  its hot examples (with no hot example the batch is exactly the baseline's); the batch's hot examples,
  numbered in global order, are cut into ``round(hot / --minibatch-size)`` hot mini-batches of equal
  share (one small all-reduce of per-rank, per-mini-batch hot counts), so K ranks form the same
  mini-batches as one process reading the same K shards. Every mini-batch is all-hot or all-cold,
  except that a batch with fewer than half a mini-batch of hot inputs trains them in their cold
  mini-batches (a tiny hot mini-batch would take a whole optimizer step on a few inputs).
- **Training**: a mini-batch's cold keys go through the normal sparse sync; its hot keys' rows come
  from the local replica, and after every mini-batch that may touch hot keys (every one: a cold
  input may hold hot keys too) the ranks all-reduce a dense (h, P + 1) buffer of hot-row gradients
  and touch counts and each applies the optimizer to the touched rows, so replicas stay identical.
  A hot mini-batch skips the cold exchange entirely.
- **Shuffle Scheduler** (:class:`ShuffleScheduler`, Eq. 5): inside each batch, strips of
  ``ceil(rate % of the batch's cold mini-batches)`` cold mini-batches alternate with strips of hot
  ones, cold first. At every swap of kind (across batches too) the held-out loss is measured
  (``--fae-holdout`` examples of the eval data; without eval data, the training loss of the strip
  just trained) and the rate halves when it did not fall, doubles after ``u = 4`` falls in a row
  (bounds R(1), R(100); start R(50)). Its state is saved in checkpoints (meta.json ``fae``).
- **Write-back**: at every checkpoint and at the end, each owner pushes its hot rows into its MEM-PS
  (which the checkpoint flushes to SSD-PS), so exports, evaluation and resume see every update.

Thread safety: ``split`` runs in the read thread; ``order``, the hot step and ``write_back`` in the
train thread (``write_back`` also at the end, from the caller's thread, once the pipeline stopped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..data import Batch, open_dataset, share_bounds
from ..errors import InvalidInputError
from ..metrics import logloss as logloss_score
from ..profile import digest, examples_all_hot, profile, read_profile, reader_record, row_bytes_of
from ._features import Feature
from ._feed import LocalBatch, empty_batch, format_options
from ._sync import unique_inverse

#: Eq. 5: swaps of falling loss before the rate doubles (u), its bounds and its start (R(50)).
SWAP_PATIENCE = 4
RATE_MIN, RATE_MAX, RATE_START = 1.0, 100.0, 50.0


def take(batch: Batch, idx: np.ndarray) -> Batch:
    """Examples ``idx`` (k,) int64 of ``batch`` in that order, as a new Batch (vectorised gathers)."""
    lengths = np.diff(batch.offsets)[idx]
    starts = batch.offsets[:-1][idx]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    kidx = np.repeat(starts - offsets[:-1], lengths) + np.arange(int(offsets[-1]), dtype=np.int64)
    return Batch(batch.labels[idx], batch.dense[idx], batch.keys[kidx], batch.field[kidx], batch.weights[kidx],
                 offsets, batch.n_fields)


@dataclass
class ShuffleScheduler:
    """Eq. 5 of ``seeds/003``: ``rate`` in percent of a batch's mini-batches per strip."""

    rate: float = RATE_START
    prev_loss: float | None = None
    streak: int = 0          # swaps in a row whose loss fell
    swaps: int = 0
    last_kind: bool | None = None   # kind of the last trained mini-batch (True = hot)

    def swap(self, loss: float) -> None:
        """A swap happened with held-out ``loss``: update the rate (Eq. 5)."""
        if self.prev_loss is not None:
            if loss >= self.prev_loss:                      # loss did not fall: shuffle more
                self.rate, self.streak = max(self.rate / 2.0, RATE_MIN), 0
            else:
                self.streak += 1
                if self.streak >= SWAP_PATIENCE:           # fell u times in a row: shuffle less
                    self.rate, self.streak = min(self.rate * 2.0, RATE_MAX), 0
        self.prev_loss = float(loss)
        self.swaps += 1

    def state(self) -> dict:
        return {"rate": self.rate, "prev_loss": self.prev_loss, "streak": self.streak, "swaps": self.swaps,
                "last_kind": self.last_kind}


class Fae:
    """FAE state of one rank (module docstring). Built by :func:`start`; ``hot``: the pinned hot rows
    (``_hot_rows.HotRows``)."""

    def __init__(self, hot, sched: ShuffleScheduler, minibatch_size: int, holdout, info: dict):
        self.hot, self.sched = hot, sched
        self.minibatch_size = int(minibatch_size)
        self.holdout = holdout          # this rank's held-out Batch, or None (no eval data)
        self.info = info
        self.hot_examples = self.cold_examples = self.hot_minibatches = self.cold_minibatches = 0
        self._strip_loss = self._strip_examples = 0.0

    # -- read stage --------------------------------------------------------------------------------
    def split(self, local: LocalBatch, ch) -> tuple[LocalBatch, np.ndarray]:
        """``local`` regrouped as [cold mini-batches 0..P-1 | hot mini-batches 0..G-1] -> (the new
        LocalBatch, (P + G,) bool hot flags). One all-reduce of a (ranks, P) count matrix over ``ch``
        (read). Hot inputs are numbered in the global order (mini-batch, rank, position) — which is
        also the order of one process reading the same shards — and cut into G = round(hot inputs /
        minibatch_size) hot mini-batches of equal share. With G = 0 (fewer than half a mini-batch)
        they stay in their cold mini-batches: a hot mini-batch of a few inputs would take a whole
        optimizer step (Adam's steps do not shrink with the batch) on them."""
        data, bounds = local.data, local.bounds
        P = bounds.shape[0] - 1
        hot_ex = examples_all_hot(self.hot.mask(data.keys), data.offsets)
        mb = np.repeat(np.arange(P, dtype=np.int64), np.diff(bounds))        # original mini-batch of each
        local_hot = np.bincount(mb[hot_ex], minlength=P).astype(np.int64)
        counts = np.zeros((ch.size, P), np.int64)
        counts[ch.rank] = local_hot
        counts = ch.allsum_array(counts)                                     # (ranks, P) hot inputs
        total = int(counts.sum())
        slot = mb.copy()
        G = int(round(total / self.minibatch_size))  # 0: too few to fill half a mini-batch
        if G:
            idx = np.flatnonzero(hot_ex)
            mb_h = mb[idx]
            first = np.cumsum(local_hot) - local_hot                          # this rank's first hot of each mb
            g = (np.cumsum(counts.sum(axis=0)) - counts.sum(axis=0))[mb_h] + counts[:ch.rank].sum(axis=0)[mb_h] \
                + np.arange(idx.shape[0]) - first[mb_h]
            q, r = divmod(total, G)
            starts = np.arange(G) * q + np.minimum(np.arange(G), r)          # share_bounds(total, k, G)
            slot[idx] = P + np.searchsorted(starts, g, side="right") - 1
        n_slots = np.bincount(slot, minlength=P + G)
        new_bounds = np.concatenate([[0], np.cumsum(n_slots)]).astype(np.int64)
        flags = np.concatenate([np.zeros(P, np.bool_), np.ones(G, np.bool_)])
        if not hot_ex.any():
            return LocalBatch(data, new_bounds, local.shard_counts), flags
        # several shards: each new mini-batch holds its examples shard by shard, as the ranks that
        # would read the shards alone hold them (the step trains each shard's examples apart)
        sc = local.shard_counts
        S = 1 if sc is None else sc.shape[0]
        key = slot if S == 1 else slot * S + np.repeat(np.tile(np.arange(S), P), sc.T.ravel())
        counts = None if S == 1 else np.bincount(key, minlength=(P + G) * S).reshape(P + G, S).T.astype(np.int64)
        return LocalBatch(take(data, np.argsort(key, kind="stable")), new_bounds, counts), flags

    # -- train stage ---------------------------------------------------------------------------------
    def order(self, n_total: np.ndarray, hot: np.ndarray, held_out_loss):
        """Indices of the mini-batches to train, in the Shuffle Scheduler's order; calls
        ``held_out_loss()`` (collective) at every swap of kind before the next mini-batch."""
        live = np.flatnonzero(n_total > 0)
        queues = {False: [int(j) for j in live if not hot[j]], True: [int(j) for j in live if hot[j]]}
        totals = {k: len(q) for k, q in queues.items()}
        kind = False if queues[False] else True
        while queues[False] or queues[True]:
            if not queues[kind]:
                kind = not kind
            if self.sched.last_kind is not None and kind != self.sched.last_kind:
                self.sched.swap(held_out_loss())
            strip = max(1, math.ceil(self.sched.rate / 100.0 * totals[kind]))
            for _ in range(min(strip, len(queues[kind]))):
                j = queues[kind].pop(0)
                self.sched.last_kind = kind
                yield j
            kind = not kind

    def count(self, hot: bool, n: int, loss_term: float) -> None:
        """Book one trained mini-batch of ``n`` examples (all ranks) and this rank's loss term."""
        if hot:
            self.hot_examples += n
            self.hot_minibatches += 1
        else:
            self.cold_examples += n
            self.cold_minibatches += 1
        self._strip_loss += loss_term * n
        self._strip_examples += n

    def strip_loss(self, ch) -> float:
        """Mean training loss of the mini-batches since the last call, over all ranks. Collective."""
        total = ch.allsum(self._strip_loss) / max(self._strip_examples, 1.0)
        self._strip_loss = self._strip_examples = 0.0
        return total

    def state(self, ch) -> dict:
        """What a checkpoint records (JSON), the same on every rank: the scheduler, the hot set's
        fingerprint and the loss of the strip in progress (summed over ranks). Collective over ``ch``."""
        strip = ch.allsum_array(np.array([self._strip_loss], np.float64))[0]
        return dict(self.sched.state(), hot_keys=digest(self.hot.keys), hot_rows=self.hot.size,
                    strip_loss=float(strip), strip_examples=self._strip_examples)

    def restore(self, saved: dict, rank: int) -> None:
        """Continue from a checkpoint's :meth:`state` (rank 0 takes the strip's summed loss)."""
        if saved["hot_keys"] != digest(self.hot.keys):
            raise InvalidInputError(f"the checkpoint was trained with another hot set ({saved['hot_rows']} rows): "
                                    "resume with the same --fae profile and --hot-bytes")
        self.sched = ShuffleScheduler(saved["rate"], saved["prev_loss"], saved["streak"], saved["swaps"],
                                      saved["last_kind"])
        self._strip_loss = saved["strip_loss"] if rank == 0 else 0.0
        self._strip_examples = saved["strip_examples"]

    def metrics(self) -> dict:
        n = self.hot_examples + self.cold_examples
        return dict(self.info, hot_rows=self.hot.size, hot_examples=self.hot_examples,
                    hot_input_fraction=self.hot_examples / n if n else 0.0, hot_minibatches=self.hot_minibatches,
                    cold_minibatches=self.cold_minibatches, swaps=self.sched.swaps, final_rate=self.sched.rate)


@dataclass(frozen=True)
class FaeOptions:
    """The options FAE runs with: ``profile`` (``--fae``: a profile file or ``auto``), ``hot_bytes``,
    ``sample_rate`` (``--fae-sample-rate``, percent), ``holdout`` (``--fae-holdout`` examples), and of
    the job: ``minibatch_size``, ``seed``, ``batch_size``."""

    profile: str
    hot_bytes: int | None
    sample_rate: float
    holdout: int
    minibatch_size: int
    seed: int
    batch_size: int


class FaeFeature(Feature):
    """FAE in the trainer's pipeline (``_features``). ``hot``: the pinned hot rows the step trains
    (``_hot_rows.HotRows``, empty until :meth:`start`); ``opts``: :class:`FaeOptions`; ``data``: the
    job's ``DataConfig`` (profiling, the held-out examples); ``coll``: Collectives; ``row_width``;
    ``n_fields``, ``n_dense``, ``has_eval``, ``eval_options`` (the eval readers' options, None without
    --eval-data): the feed's; ``predict(rows, inv, batch) -> probs (n,)
    host``: the model's prediction over parameter rows of the step's array module; ``log``."""

    name = "fae"
    needs_host_keys = True  # a mini-batch's keys are divided into hot and cold on the host

    def __init__(self, hot, opts: FaeOptions, data, coll, row_width: int, n_fields: int, n_dense: int,
                 has_eval: bool, eval_options: dict | None, predict, log):
        self.hot, self.opts, self.data, self.coll = hot, opts, data, coll
        self.row_width, self.n_fields, self.n_dense, self.has_eval = int(row_width), n_fields, n_dense, has_eval
        self.eval_options = eval_options
        self.predict, self.log = predict, log
        self.fae: Fae | None = None
        self._read_owned = self._memps = None

    def start(self, job) -> None:
        """Pin the hot rows on every rank (main channel, collective) and restore the scheduler state of
        the checkpoint ``job.resumed`` (its meta, or None)."""
        keys, _, info = self._hot_keys()
        self._read_owned, self._memps = job.hier.read_owned, job.hier.memps
        hot = self.hot
        hot.pin(keys, self.coll.main.pull_rows(keys, self._read_owned) if keys.shape[0] else None)
        self.fae = Fae(hot, ShuffleScheduler(), self.opts.minibatch_size, self._holdout(self.opts.holdout), info)
        saved = (job.resumed or {}).get("fae")
        if saved is not None:
            self.fae.restore(saved, self.coll.rank)
        self.log(f"hps: FAE: {hot.size:,} hot rows pinned in HBM-PS on every rank "
                 f"({hot.size * row_bytes_of(self.row_width) / 2**20:.2f} MiB each), shuffle rate "
                 f"R({self.fae.sched.rate:g})")

    def on_read(self, w, ch) -> None:
        w.local, w.hot = self.fae.split(w.local, ch)

    def order(self, w):
        return self.fae.order(w.n_total, w.hot, self.held_out_loss)

    def after_minibatch(self, w, j: int, n: int, loss) -> None:
        self.fae.count(bool(w.hot[j]), n, loss())

    def save(self, w, ckpt) -> None:
        """The pinned hot rows go through MEM-PS/SSD-PS like every other row (the checkpoint flushes
        them); the scheduler's state goes into the meta. Collective over the train channel."""
        self.hot.write_back(self._memps, self.coll.owned_mask)
        ckpt.meta["fae"] = self.fae.state(self.coll.train)

    def finish(self) -> None:
        self.hot.write_back(self._memps, self.coll.owned_mask)

    def metrics(self, per_rank: list) -> dict:
        return {"fae": self.fae.metrics()}

    def held_out_loss(self) -> float:
        """Logloss of the model now on the held-out examples of every rank (train channel; collective).
        Without eval data: the training loss since the last swap."""
        fae, ch = self.fae, self.coll.train
        if not ch.any(fae.holdout is not None):
            return fae.strip_loss(ch)
        batch = fae.holdout if fae.holdout is not None else empty_batch(self.n_fields, self.n_dense)
        keys, inv = unique_inverse(batch.keys)
        cold, inv, slots = fae.hot.divide(keys, inv)
        slots = np.empty(0, np.int64) if slots is None else slots
        xp, P = self.hot.xp, self.hot.row_params
        rows = xp.concatenate([xp.asarray(ch.pull_owned(cold, self._read_owned)[:, :P]), fae.hot.params(slots)])
        probs = self.predict(rows, inv, batch) if len(batch) else np.empty(0)
        local = logloss_score(batch.labels, probs) * len(batch) if len(batch) else 0.0
        sums = ch.allsum_array(np.array([local, len(batch)], np.float64))
        return float(sums[0] / max(sums[1], 1.0))

    def _hot_keys(self) -> tuple[np.ndarray, np.ndarray, dict]:
        """(hot keys ascending, their sampled counts, profile facts) from --fae PROFILE or by profiling
        (--fae auto), on rank 0, shared with every rank (main channel)."""
        o, d, main = self.opts, self.data, self.coll.main
        row_bytes = row_bytes_of(self.row_width)
        prof, problem = None, None
        if self.coll.rank == 0:
            try:
                if o.profile == "auto":
                    prof = profile(d.data, d.format, o.hot_bytes, row_bytes, o.sample_rate, seed=o.seed,
                                   fmt_options=format_options(d, o.seed, o.batch_size))
                else:
                    prof = read_profile(o.profile)
                    run = reader_record(d.format, format_options(d, o.seed, o.batch_size))
                    if prof.reader and prof.reader != run:  # its keys are not this run's
                        raise InvalidInputError(f"--fae {o.profile} profiled data read as {prof.reader}; this "
                                                f"run reads {run}: profile again with the run's reader options")
            except InvalidInputError as e:
                problem = str(e)
        problem = main.allgather(problem)[0]
        if problem:
            raise InvalidInputError(problem)
        keys, counts = (prof.hot_keys, prof.hot_counts) if prof is not None else (None, None)
        keys, counts = main.allgather((keys, counts))[0]
        info = {}
        if prof is not None:
            self.log(f"hps: {prof.describe()}")
            info = {"profile": {k: getattr(prof, k) for k in ("threshold_count", "estimate", "interval_low",
                                                              "interval_high", "logged_hot", "hot_input_fraction",
                                                              "sample_rate", "seconds", "budget_rows")}}
        info = main.allgather(info)[0]
        if o.hot_bytes is not None and keys.shape[0] * row_bytes > o.hot_bytes:  # a profile made for more
            keep = np.lexsort((keys, -counts))[:o.hot_bytes // row_bytes]
            keys, counts = keys[np.sort(keep)], counts[np.sort(keep)]
        return keys, counts, info

    def _holdout(self, n: int):
        """This rank's share (``share_bounds``) of the first ``n`` examples of the eval data (synthetic:
        of its eval split), or None without eval data. The same examples whatever the ranks and shards."""
        d, o = self.data, self.opts
        if n == 0 or not self.has_eval:
            return None
        if d.eval_data:  # the eval readers' options: the training data's columns by name and dense statistics
            opts = {k: v for k, v in self.eval_options.items() if k != "readers"}
            it = open_dataset(d.eval_data, d.format, n, strict=d.strict, max_malformed=d.max_malformed,
                              **opts).batches()
        else:
            it = open_dataset(None, "synthetic", n, **format_options(d, o.seed, o.batch_size)).eval_batches()
        parts, got = [], 0
        for b in it:
            parts.append(b.slice(0, min(len(b), n - got)))
            got += len(parts[-1])
            if got >= n:
                break
        if not parts:
            return None
        first = Batch.concat(parts)
        a, b = share_bounds(len(first), self.coll.rank, self.coll.size)
        return first.slice(a, b)
