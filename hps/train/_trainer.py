"""``Trainer``: wires data, tiers, model and collectives into the 4-stage pipeline (Algorithm 1).

Stages (threads joined by bounded queues, ``hps.pipeline``); under MPI every stage that communicates
has its own duplicate of the job's communicator (``_collectives``):

1. ``read``    parse this rank's next local batch — its shards of the data only (``_feed``) — and
               agree with the other ranks on the size of every global mini-batch and on where the
               epoch ends (one small all-reduce per batch);
2. ``prepare`` plan the mini-batches and find the keys this rank holds resident for the batch
               (``_sync``: keys sent to their owners, or gathered from every rank); evict what left
               the residency window and fetch the rest from MEM-PS/SSD-PS;
3. ``place``   insert the fetched rows into HBM-PS (growing it if needed); on ``--device cuda`` also
               upload the batch's plan (``_device_step``);
4. ``train``   per global mini-batch: rows -> forward/backward on this rank's examples -> summed
               gradient of every key -> one optimizer step per key -> dense all-reduce and step
               (on ``--device cuda``: on the HBM-PS rows in place, ``_device_step``; with
               ``--dense-sync easgd`` over the rank's group, ``_easgd``).
               Checkpoints happen here, at batch boundaries.

Not thread-safe: one Trainer per process, driven by one caller.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np

from ..comm import SPARSE_KEYS
from ..config import Config
from ..errors import HashTableFullError, InvalidInputError, NumericalError, PipelineError
from ..mem import MemPS, RowInitializer
from ..metrics import auc as auc_score
from ..metrics import logloss as logloss_score
from ..model import ModelConfig, make_model, make_optimizers
from ..pipeline import STOP_TIMEOUT_S, Pipeline, Stage
from ..ssd import ScratchEnv, SSDOptions, SSDStore
from . import _checkpoint, _export, _fae, _warmup
from ._admission import FeatureFilter, shared_keys
from ._blas import DenseThreads
from ._budget import plan_memory
from ._control import TrainingControl, best_dir, run_name
from ._collectives import Collectives
from ._device_step import make_device_step, transfer_metrics
from ._easgd import make_dense_sync
from ._feed import Feed, LocalBatch, empty_batch
from ._het_sync import het_metrics, is_cut, make_het_sync
from ._hierarchy import ParameterHierarchy, _host, make_hbm
from ._preflight import check_memory
from ._schedule import LRSchedule
from ._ssd_dir import SSDDir
from ._sync import make_sync, unique_inverse

#: prepare(i) waits for train(i - WINDOW); keys unused for WINDOW batches leave HBM-PS.
WINDOW = 3
#: Under MPI, how long a stopping pipeline waits for its stages: one may be blocked for good in a
#: collective that its peers, stopped by the same signal a batch earlier, never join.
MPI_STOP_TIMEOUT_S = 10.0
#: Pipeline stages and the channel whose MPI time each one's thread spends.
STAGE_CHANNELS = {"read": "read", "prepare": "prepare", "place": None, "train": "train"}


@dataclass
class Work:
    epoch: int
    batch: int             # index within the epoch
    index: int             # global batch counter (resume-stable)
    local: LocalBatch      # this rank's examples of the global batch
    n_total: np.ndarray    # (P,) int64 examples of each global mini-batch (all ranks)
    last_in_epoch: bool = False
    plans: list | None = None
    prepared: object | None = None
    filter_state: dict | None = None   # admission/expiry state after this batch's prepare (checkpoints)
    staged: list | None = None   # the plans on the device (--device cuda, _device_step)
    hot: np.ndarray | None = None  # FAE: (P,) bool, which mini-batches are all-hot (``_fae``)


class Trainer:
    """Train a CTR model over the three tiers. ``coll``: :class:`Collectives` (default: one process).
    ``on_fatal(error)``: called at once, from the failing thread, when a pipeline stage fails in an
    MPI job (the CLI aborts the job there, so no peer waits for this rank in a collective).
    ``feed``: the data (default: this rank's shards of ``cfg``'s data, :class:`Feed`).
    ``first_batch``: this rank's first local batch (a Batch, or None), parsed at construction for the
    memory plan and kept for the kernel warm-up; :meth:`fit` drops it."""

    def __init__(self, cfg: Config, coll=None, log=print, on_fatal=None, feed=None):
        self.cfg = cfg
        self.coll = coll or Collectives()
        self.log = log if self.coll.rank == 0 else (lambda *a, **k: None)
        self.on_fatal = on_fatal
        m, t = cfg.model, cfg.tiers
        self.xp = _array_module(t.device)
        # the dense model's host threads: --blas-threads, else sized between batches to idle cores (_blas)
        self.dense_threads = DenseThreads(cfg.train.blas_threads, self.coll.cores_per_rank)
        self.blas_threads = self.dense_threads.label
        self.feed = feed or Feed(cfg, self.coll.rank, self.coll.size, self.coll.cores_per_rank)
        check_memory(self.feed.n_fields, self.feed.n_dense, cfg, self.coll.size)
        mcfg = ModelConfig.from_options(m, self.feed.n_fields, self.feed.n_dense, cfg.train.seed)
        self.model = make_model(mcfg, xp=self.xp)
        self.sparse_opt, self.dense_opt = make_optimizers(mcfg)
        self.row_params = self.model.row_params  # leading row columns the model trains; state follows
        self.row_width = self.sparse_opt.row_width(self.row_params)
        self.initializer = RowInitializer(self.row_params, self.row_width, cfg.train.seed, m.init_scale,
                                          state_value=self.sparse_opt.initial_state_value)
        self.dense_sync = make_dense_sync(cfg, self.coll, self.model.params)  # --dense-sync, --compress
        self.het = cfg.train.consistency == "het"  # HET caches (_het_sync): hooks marked "het" below
        if self.het:
            self.sync = make_het_sync(cfg, self.coll, self.model, self.sparse_opt, self.row_params,
                                      self.row_width, self.xp)
        else:
            self.sync = make_sync(cfg.train.sparse_sync, self.coll, self.model, self.sparse_opt,
                                  self.row_params, self.xp, compress=self.dense_sync.compress)
        self._init_control()
        # GPU-resident training on --device cuda (None on the CPU): rows stay in the HBM-PS
        self.device = make_device_step(cfg, self.coll, self.model, self.sparse_opt, self.dense_opt,
                                       self.row_params, self.xp, self.sync.replicated)
        self.store = None
        # this job's own directory (never one another job or the user holds), removed by close()
        self._ssd = SSDDir.claim(t.ssd_path, self.coll.rank, self.coll.size, keep=t.keep_ssd, log=log)  # every rank
        self.ssd_dir = self._ssd.store_path
        try:
            resident, owned = self._first_working_set()
            self.plan = plan_memory(t.mem_budget or _DEFAULT_BUDGET, self.row_width, owned, resident,
                                    window=WINDOW, device=t.device, n_parts=t.n_parts,
                                    hbm_capacity=t.hbm_capacity, rows_per_file=t.rows_per_file)
            self.log(f"hps: {self.plan.describe()}")
            # SSD-PS is this run's scratch space (durability comes from checkpoints): no fsync per dump
            opts = SSDOptions(page_cache=t.ssd_page_cache, **self.plan.ssd_options())
            self.store = SSDStore(str(self.ssd_dir), self.row_width, dtype=np.float32,
                                  rows_per_file=t.rows_per_file, options=opts, env=ScratchEnv())
            self.memps = MemPS(self.store, self.row_width, capacity_rows=self.plan.cache_rows,
                               initializer=self.initializer)
        except BaseException:  # a bad value or an interrupt: leave nothing behind
            self.close()
            raise
        self.hier = None  # built on the first batch, when the working-set size is known
        self.peak_resident = 0
        self.start_index = 0
        self.history = {"loss": []}
        self.fae = None        # FAE state (``_fae``), from fit() on when --fae is given
        self._resumed = None   # meta of the checkpoint resume() loaded

    def _init_control(self) -> None:
        """Issue 14: admission and expiry (``_admission``), the learning-rate schedule (``_schedule``),
        evaluation during training and early stopping (``_control``)."""
        tc = self.cfg.train
        if 0 < tc.expire_after < WINDOW:
            raise InvalidInputError(f"--expire-after must be at least {WINDOW} batches (the residency window: "
                                    f"an expiring key must have left HBM-PS), got {tc.expire_after}")
        if tc.eval_every and not self.feed.has_eval:
            raise InvalidInputError(f"--eval-every needs eval data: give --eval-data FILE "
                                    f"(--format {self.cfg.data.format})")
        self.filter = (FeatureFilter(self.coll, tc.admit_after, tc.expire_after, tc.admit_sketch_width)
                       if tc.admit_after > 1 or tc.expire_after else None)
        self.schedule = LRSchedule(tc, len(self.feed.sizes), self.sparse_opt, self.dense_opt)
        self.control = TrainingControl(tc.eval_every, tc.early_stop, WINDOW, best_dir(tc))

    def _first_working_set(self) -> tuple[int, int]:
        """(keys this rank will hold resident for the first batch, how many of them it owns): the
        working set the memory plan is checked against before training starts. Each rank parses only
        its own first local batch; the keys meet at their owners (``owner``) or are gathered by every
        rank (``allreduce``). Collective over the main channel."""
        batches = self.feed.epoch()
        first = next(batches, None)
        batches.close()  # a suspended reader would hold its file open
        # kept for the warm-up, which compiles on it instead of parsing the data again (fit drops it)
        self.first_batch = first.data if first is not None else None
        local = unique_inverse(first.data.keys)[0] if first is not None else np.empty(0, np.uint64)
        if self.sync.replicated:
            everyone = unique_inverse(self.coll.main.allgatherv(local, SPARSE_KEYS))[0]
            return everyone.shape[0], int(self.coll.owned_mask(everyone).sum())
        asked = self.coll.main.exchange_by_owner(local, SPARSE_KEYS)[0]
        owned = unique_inverse(asked)[0].shape[0]
        return owned, owned

    # -- stages ---------------------------------------------------------------------------------------------
    def _source(self):
        """This rank's local batches in global order. Per batch the ranks agree (read channel) on the
        size of every global mini-batch and on whether any rank has another batch: a rank whose
        shards ran out contributes empty batches until every rank has (one batch of lookahead)."""
        index = 0
        ch = self.coll.read
        for epoch in range(self.cfg.train.epochs):
            it = self.feed.epoch(epoch)
            cur = next(it, None)
            b = 0
            while True:
                nxt = next(it, None)
                local = cur if cur is not None else self.feed.empty()
                hot = None
                if self.fae is not None:  # FAE: regroup into all-cold and all-hot mini-batches
                    local, hot = self.fae.split(local, ch)
                n_total, more = ch.agree(local.counts, nxt is not None and not self._read_past_stop(index))
                if not n_total.any():  # no shard holds an example (each was fine on its own)
                    raise InvalidInputError(f"no valid example in --data {self.cfg.data.data}: every one "
                                            f"of its {self.feed.n_shards} shards is empty")
                if index >= self.start_index:
                    yield Work(epoch, b, index, local, n_total, last_in_epoch=not more, hot=hot)
                index += 1
                b += 1
                if not more:
                    break
                cur = nxt
            if self.control.patience and ch.any(self.control.stopping):  # early stop: no next epoch
                return

    def _ensure_hierarchy(self):
        if self.hier is not None:
            return
        t = self.cfg.tiers
        hbm = make_hbm(self.plan.hbm_keys, self.row_width, t.device, t.n_parts, t.gpus)
        if self.device is not None:
            hbm = self.device.wrap(hbm)
        pull = self.coll.prepare.pull_rows if self.sync.replicated else None
        self.hier = ParameterHierarchy(hbm, self.memps, WINDOW, self.coll.owned_mask, pull)
        if self.het:
            self.sync.bind(self.hier)
        self.hier.mark_trained(self.start_index - 1)  # resumed: the batches before were trained

    def _gate(self, w: Work) -> None:
        if self.hier is not None:
            self.hier.wait_ready(w.index, self.pipeline.stop_event)
            after_cut = w.batch == 0 or is_cut(self.cfg.train, w.index - 1, False)
            if self.het and w.index > self.start_index and after_cut:
                # het: a consistent cut ends batch index - 1 (flushed by train); nothing is prepared past it
                self.hier.wait_ready(w.index - 1 + WINDOW, self.pipeline.stop_event)
            if self.control.cut_before(w.index):  # the best checkpoint is the model after its batch (_control)
                self.hier.wait_ready(w.index - 1 + WINDOW, self.pipeline.stop_event)

    def _read_past_stop(self, index: int) -> bool:
        """Early stopping decided and batch ``index`` is past what ``prepare`` still runs (_control)."""
        return self.control.skip_prepare(index + 1)

    def _prepare(self, w: Work) -> Work:
        if self.control.skip_prepare(w.index):
            return w
        if self.filter is not None:  # admission: keys not admitted become their field's shared key
            w.local = LocalBatch(replace(w.local.data, keys=self.filter.admit(w.local.data.keys)), w.local.bounds)
        resident, w.plans = self.sync.plan(w.local) if self.fae is None else self.sync.plan(w.local, self.fae.hot)
        self._ensure_hierarchy()
        w.prepared = self.hier.prepare(w.index, resident)
        self.peak_resident = max(self.peak_resident, self.hier.resident)
        if self.filter is not None:  # expiry: the owner's keys of this batch are used now
            self.filter.touch(w.index, resident)
            self.filter.expire(w.index, self.hier.delete)
            if self._checkpoint_due(w) or self.control.keeps_best(w.index):
                w.filter_state = self.filter.state()
        return w

    def _place(self, w: Work) -> Work:
        if w.prepared is None:
            return w
        try:
            self.hier.place(w.prepared)
        except HashTableFullError as e:
            raise HashTableFullError(f"{e} (HBM-PS holds the working sets of {WINDOW + 1} batches: raise "
                                     "--hbm-capacity or lower --batch-size)") from None
        if self.device is not None:
            w.staged = self.device.upload(w.local, w.plans, self.hier.hbm)
        return w

    def _train(self, w: Work) -> dict:
        if self.control.skip_train(w.index):  # early stopping: not trained
            if self.hier is not None:
                self.hier.mark_trained(w.index)
            return {"index": w.index, "loss": None, "examples": 0}
        schedule = self.schedule.apply if self.schedule.active else None
        if self.device is not None:
            loss_sum = self.device.train_batch(self.hier.hbm, w.plans, w.staged, w.n_total, w.index, schedule)
        else:
            loss_sum = self._train_host(w, schedule)
        n_ex = int(w.n_total.sum())
        loss_sum = self.coll.train.allsum(loss_sum)
        if not math.isfinite(loss_sum):
            raise NumericalError(f"training loss became {loss_sum} at epoch {w.epoch} batch {w.batch}; "
                                 "lower --lr/--dense-lr or check the data for inf/NaN features")
        if self.het and is_cut(self.cfg.train, w.index, w.last_in_epoch):
            self.sync.flush()
        self.dense_threads.after_batch(self.pipeline.stage_times())  # hook: threads for the next batch
        cut = self.control.keeps_best(w.index)  # prepare(index + 1) waits for the evaluation, the best too
        if not cut:
            self.hier.mark_trained(w.index)
        saved = []  # at most one checkpoint of this batch: for the best model, and when it is due

        def save():
            if not saved:
                saved.append(self.save_checkpoint(w.index, w.epoch, w.batch, w.filter_state))

        self.control.after_batch(w.index, n_ex, self._evaluate_now, save)  # first: checkpoints hold its state
        if self._checkpoint_due(w):
            save()
        if self.control.stop == w.index and self.control.pinned() and self.coll.rank == 0:  # one writer of LATEST
            _checkpoint.point_latest(self.control.checkpoint_dir, self.control.pinned()[0])
        if cut:
            self.hier.mark_trained(w.index)
        return {"index": w.index, "loss": loss_sum / max(n_ex, 1), "examples": n_ex}

    def _evaluate_now(self) -> tuple[float, float]:
        """(AUC, logloss) of the model as it is, the same on every rank (train channel)."""
        m = self.evaluate(ch=self.coll.train)
        auc, logloss = self.coll.train.allgather((m.get("auc"), m.get("logloss")))[0]
        return float(auc), float(logloss)

    def _train_host(self, w: Work, schedule) -> float:
        loss_sum = 0.0
        fae = self.fae
        order = range(len(w.plans)) if fae is None else fae.order(w.n_total, w.hot, lambda: _fae.held_out_loss(self))
        for j in order:
            n = int(w.n_total[j])
            if n == 0:
                continue  # every shard had run out
            if schedule is not None:
                schedule(w.index, j)
            share = w.local.minibatch(j)
            hot_mb = fae is not None and bool(w.hot[j])
            hot = {} if fae is None else {"hot": fae.hot, "hot_only": hot_mb}
            loss, g_dense = self.sync.step(self.hier.hbm, w.index, w.plans[j], share, n, **hot)
            self._dense_step(g_dense, len(share), n)
            loss_sum += loss * n
            if fae is not None:
                fae.count(hot_mb, n, loss)
        return loss_sum

    def _dense_step(self, grads: dict, n_local: int, n_total: int) -> None:
        names = list(grads)
        hot = self.fae.hot.take_pending() if self.fae is not None else None  # FAE: fused hot-row sums
        if self.coll.size > 1:
            flat = np.concatenate([_host(grads[k]).ravel() for k in names])
            if hot is not None:  # one all-reduce of [dense gradients | hot rows' buffer]
                both = self.dense_sync.allreduce(np.concatenate([flat, hot]), n_local, n_total)
                flat = both[:flat.shape[0]]
                self.fae.hot.apply(both[flat.shape[0]:])
            else:
                flat = self.dense_sync.allreduce(flat, n_local, n_total)  # all ranks, or this rank's group
            if flat is None:  # this rank's group had no example in the mini-batch
                self.dense_sync.after_step(self.model.params)
                return
            off = 0
            for k in names:
                n = grads[k].size
                grads[k] = self.xp.asarray(flat[off:off + n].reshape(grads[k].shape))
                off += n
        self.dense_opt.step(self.model.params, grads)
        self.dense_sync.after_step(self.model.params)

    # -- checkpoints ------------------------------------------------------------------------------------
    def _checkpoint_due(self, w: Work) -> bool:
        tc = self.cfg.train
        return bool(tc.checkpoint_dir) and bool(
            (tc.checkpoint_every and (w.index + 1) % tc.checkpoint_every == 0) or w.last_in_epoch)

    def save_checkpoint(self, index: int, epoch: int, batch: int, filter_state: dict | None = None) -> str:
        """Write a checkpoint after batch ``index`` (with the admission/expiry state ``filter_state``
        taken by that batch's prepare). Collective over the train channel: call it from the train
        stage (or after training)."""
        meta = {"index": index, "epoch": epoch, "batch": batch, "control": self.control.state()}
        if self.fae is not None:  # pinned hot rows go through MEM-PS/SSD-PS like every other row
            self.fae.hot.write_back(self.memps, self.coll.owned_mask)
            meta["fae"] = self.fae.state(self.coll.train)
        self.hier.sync_to_store()
        tc = self.cfg.train
        writers = []
        if self.filter is not None:  # admission/expiry state as of batch index
            st = filter_state if filter_state is not None else self.filter.state()
            writers.append(self.filter.checkpoint_writer(st))
        easgd = self.dense_sync.checkpoint_writer(self.model.params, self.dense_opt)  # None without groups
        writers += [easgd] if easgd is not None else []
        extra = (lambda h: [write(h) for write in writers]) if writers else None
        return _checkpoint.save(self.control.checkpoint_dir, self.coll.train, self.store, self.model, self.dense_opt,
                                meta, keep=tc.keep_checkpoints, extra=extra, pinned=self.control.pinned(),
                                model_meta=self._model_meta())

    def resume(self) -> None:
        meta = _checkpoint.load(self.cfg.train.checkpoint_dir, self.coll.main, self.store, self.model,
                                self.dense_opt, warn=lambda msg: self.log(f"hps: warning: {msg}"),
                                extra=self._read_checkpoint_extra)
        self.dense_sync.restore(self.model.params, self.dense_opt)  # this rank's group copy (--groups)
        self.start_index = meta["index"] + 1
        if "control" in meta:  # the eval curve, the best, early stopping (absent before issue 14)
            self.control.load_state(meta["control"])
        self._resumed = meta
        self.log(f"resumed from {meta['path']} (after batch {meta['index']}, epoch {meta['epoch']})")

    def _read_checkpoint_extra(self, h) -> None:
        """What ``save_checkpoint``'s writers put in this rank's checkpoint file ``h``."""
        if self.filter is not None:
            self.filter.read_checkpoint(h)
        self.dense_sync.read_checkpoint(h)

    # -- run ----------------------------------------------------------------------------------------------
    def _stage_failed(self, stage: str, exc: BaseException) -> None:
        if self.on_fatal is not None and self.coll.size > 1:
            err = PipelineError(stage, f"{type(exc).__name__}: {exc}")
            err.__cause__ = exc
            self.on_fatal(err)

    def fit(self, warm_up: bool = True) -> dict:
        """Train every batch (after the checkpoint, with ``resume``) -> :meth:`metrics`. With ``warm_up``
        the kernels are compiled first (``_warmup``), outside the timed part. The dense model's threads
        are sized meanwhile (``_blas``: ``--blas-threads``)."""
        with self.dense_threads.bound(self.model):
            return self._fit(warm_up)

    def _fit(self, warm_up: bool) -> dict:
        tc = self.cfg.train
        if tc.resume:  # first: a missing or damaged checkpoint is reported before the warm-up's compile
            self.resume()
        self.warmup_seconds = _warmup.warm_up(self, self.log) if warm_up else 0.0
        self.first_batch = None
        if tc.fae and self.fae is None:
            self.fae = _fae.start(self, self._resumed, self.log)
        rows = self.feed.total_rows  # known for synthetic data; files stream
        total = rows * tc.epochs if rows is not None else None
        bar = _progress(tc.progress and self.coll.rank == 0, total, self.start_index * tc.batch_size)
        self.pipeline = Pipeline("read", self._source(), [Stage("prepare", self._prepare, gate=self._gate),
                                                           Stage("place", self._place),
                                                           Stage("train", self._train)],
                                 depth=tc.queue_depth, on_error=self._stage_failed,
                                 stop_timeout_s=MPI_STOP_TIMEOUT_S if self.coll.size > 1 else STOP_TIMEOUT_S,
                                 waiting_on_peers=lambda stage: self.coll.in_call(STAGE_CHANNELS[stage]))
        t0, c0 = time.perf_counter(), time.process_time()
        examples = 0

        last_bar = [0.0]

        def sink(res):
            nonlocal examples
            if res["loss"] is None:  # not trained (early stopping)
                return
            examples += res["examples"]
            self.history["loss"].append(res["loss"])
            if bar is not None:
                bar.update(res["examples"])
                now = time.perf_counter()
                if now - last_bar[0] > 2.0:  # cache stats scan the cache: not every batch
                    last_bar[0] = now
                    bar.set_postfix(loss=f"{res['loss']:.4f}", hit=f"{self.memps.stats()['hit_rate']:.3f}",
                                    refresh=False)

        try:
            self.pipeline.run(sink)
            self.dense_sync.finish(self.model.params)  # easgd: every rank takes the centre copy
        finally:
            if self.hier is not None:
                self.hier.abort()
            if bar is not None:
                bar.close()
        self.train_seconds = time.perf_counter() - t0
        self.train_cpu_seconds = time.process_time() - c0  # every thread of the process
        self.examples = examples
        if self.fae is not None:
            self.fae.hot.write_back(self.memps, self.coll.owned_mask)
        if self.hier is not None:
            self.hier.drop_all()
        elif tc.resume:
            self.log(f"nothing left to train: the checkpoint is past the last batch of --epochs {tc.epochs}")
        return self.metrics()

    def evaluate(self, batches=None, ch=None) -> dict:
        """AUC and logloss on ``batches`` (default: this rank's shards of the eval data; synthetic: its
        eval split), on rank 0; {} without eval data. Every rank predicts its own batches with rows
        pulled from their owners (main channel); labels and probabilities are gathered on rank 0.
        Collective over ``ch`` (default the main channel; ranks may hold different numbers of
        batches). With admission, keys not admitted are scored with their field's shared row."""
        if batches is None:
            if not self.feed.has_eval:
                return {}
            batches = self.feed.eval_batches()
        batches = iter(batches)
        # nothing trained in this run (resumed after the last batch): the rows are in the tiers
        self._ensure_hierarchy()
        ch, P = ch or self.coll.main, self.row_params
        labels, probs = [], []
        while True:
            batch = next(batches, None)
            if not ch.any(batch is not None):
                break
            if batch is None:
                batch = empty_batch(self.feed.n_fields, self.feed.n_dense)
            keys, inv = unique_inverse(batch.keys)
            if self.filter is not None and self.filter.admitting:
                ok = ch.pull_owned(keys, lambda k: self.filter.admitted_mask(k).astype(np.float32)[:, None])
                keys, again = unique_inverse(np.where(ok[:, 0] > 0, keys, shared_keys(keys)))
                inv = again[inv]
            rows = ch.pull_owned(keys, self.hier.read_owned)
            labels.append(batch.labels)
            probs.append(_host(self.model.predict(self.xp.asarray(rows[:, :P]), inv, batch)))
        lab = ch.gather(np.concatenate(labels) if labels else np.empty(0, np.float32))
        pr = ch.gather(np.concatenate(probs) if probs else np.empty(0, np.float32))
        malformed = ch.allgather(self.feed.eval_malformed())
        if self.coll.rank != 0:
            return {}
        out = {"auc": auc_score(lab, pr), "logloss": logloss_score(lab, pr), "eval_examples": int(lab.shape[0])}
        if self.cfg.data.eval_data:
            out.update(eval_malformed_lines=sum(n for n, _ in malformed),
                       eval_malformed_first=[x for _, first in malformed for x in first])
        return out

    def rank_metrics(self) -> dict:
        """This rank's share of the work: bytes parsed, peak resident rows, bytes sent by kind, CPU
        seconds of each stage's thread outside MPI, wall and CPU seconds inside MPI, SSD-PS figures."""
        chans = self.coll.channels()
        times = self.pipeline.stage_times()
        cpu = {s: times[s].cpu - (chans[c].mpi_cpu_seconds if c else 0.0) for s, c in STAGE_CHANNELS.items()}
        mpi = {s: chans[c].mpi_seconds for s, c in STAGE_CHANNELS.items() if c}
        mpi_cpu = {s: chans[c].mpi_cpu_seconds for s, c in STAGE_CHANNELS.items() if c}
        st = self.store.stats()
        return {"bytes_parsed": self.feed.bytes_parsed, "resident_rows": self.peak_resident,
                "bytes_sent": self.coll.bytes_sent(), "stage_cpu_seconds": cpu, "mpi_seconds": mpi,
                "mpi_cpu_seconds": mpi_cpu, "malformed": self.feed.malformed(),
                "filter": self.filter.metrics() if self.filter is not None else None,
                "ssd_rows_loaded": self.memps.stats()["ssd_loads"],
                "ssd": {k: st[k] for k in ("bytes_read", "bytes_written", "disk_bytes", "files", "live_rows")},
                "transfers": self.device.ledger.metrics() if self.device is not None else None,
                "het": self.sync.stats() if self.het else None}

    def metrics(self) -> dict:
        """Job metrics. Per-rank figures are lists in rank order; SSD-PS figures and bytes sent are
        summed over ranks; cache figures and stage wall seconds are rank 0's. Collective."""
        out = self._metrics()
        if self.fae is not None:
            out["fae"] = self.fae.metrics()
        return out

    def _metrics(self) -> dict:
        per = self.coll.main.allgather(self.rank_metrics())
        ssd = {k: sum(r["ssd"][k] for r in per) for k in per[0]["ssd"]}
        ms = self.memps.stats()
        times = {name: t.busy for name, t in self.pipeline.stage_times().items()}
        out = {"consistency": self.cfg.train.consistency}
        if self.het:
            out.update(het_metrics([r["het"] for r in per], self.cfg.train.staleness))
        return out | {
            "examples": self.examples,
            "train_seconds": self.train_seconds,
            "train_cpu_seconds": self.train_cpu_seconds,
            "warmup_seconds": self.warmup_seconds,
            "examples_per_sec": self.examples / self.train_seconds if self.train_seconds else 0.0,
            "stage_seconds": times,
            "stage_wait_seconds": {n: t.wait_in + t.wait_out for n, t in self.pipeline.stage_times().items()},
            "bottleneck": self.pipeline.bottleneck(),
            "cache_hit_rate": ms["hit_rate"],
            "cache_hit_rate_per_batch": [float(x) for x in ms["per_batch_hit_rate"]],
            "ssd_bytes_read": ssd["bytes_read"],
            "ssd_bytes_read_per_rank": [r["ssd"]["bytes_read"] for r in per],
            "ssd_bytes_written": ssd["bytes_written"],
            "ssd_disk_bytes": ssd["disk_bytes"],
            "ssd_files": ssd["files"],
            "table_rows": ssd["live_rows"],
            "ssd_rows_loaded": sum(r["ssd_rows_loaded"] for r in per),
            "sparse_parameters": ssd["live_rows"] * self.row_params,
            "dense_parameters": sum(int(p.size) for p in self.model.params.values()),
            "ranks": self.coll.size,
            "data_shards": self.feed.n_shards,
            "sparse_sync": self.cfg.train.sparse_sync,
            **self.dense_sync.metrics(),
            "mpi_wait": self.coll.wait_mode,
            "blas_threads": self.blas_threads,
            **self.dense_threads.metrics(),
            "comm_seconds": self.coll.mpi_seconds(),
            "bytes_parsed": [r["bytes_parsed"] for r in per],
            "resident_rows": [r["resident_rows"] for r in per],
            "bytes_sent": {k: sum(r["bytes_sent"][k] for r in per) for k in per[0]["bytes_sent"]},
            "bytes_sent_per_rank": [r["bytes_sent"] for r in per],
            "stage_cpu_seconds": [r["stage_cpu_seconds"] for r in per],
            "mpi_seconds": [r["mpi_seconds"] for r in per],
            "mpi_cpu_seconds": [r["mpi_cpu_seconds"] for r in per],
            "loss_per_batch": self.history["loss"],
            "malformed_lines": sum(r["malformed"][0] for r in per),
            "malformed_first": [x for r in per for x in r["malformed"][1]],
            **self._control_metrics(per),
            **transfer_metrics([r["transfers"] for r in per]),  # host <-> device bytes by purpose
        }

    def _control_metrics(self, per: list) -> dict:
        """Issue 14: admission/expiry counts (summed over ranks), the eval curve, early stopping."""
        out = {"run_name": run_name(self.cfg), **self.control.metrics()}
        if self.filter is not None:
            out.update(admitted_keys=sum(r["filter"]["admitted"] for r in per),
                       expired_keys=sum(r["filter"]["expired"] for r in per),
                       known_keys=sum(r["filter"]["known"] for r in per))
        return out

    def describe_model(self) -> str:
        """One line: the architecture, its dense parameter count and the layout of an embedding row."""
        m = self.model
        dense = sum(int(p.size) for p in m.params.values())
        state = self.row_width - self.row_params
        row = (f"{m.emb_dim} embedding" + (" + 1 first-order weight" if m.first_order else "")
               + (f" + {state} {self.sparse_opt.name} state" if state else ""))
        return (f"model: {m.describe()}; {dense:,} dense parameters ({self.dense_opt.name}); "
                f"one row of {self.row_width} floats ({row}) per key, made on first use")

    def _model_meta(self) -> dict:
        """The model and its input (``_records.export_meta``), for exports and checkpoints."""
        from ._records import export_meta

        return export_meta(self.cfg, self.feed, self.model, getattr(self.feed, "format_options", {}))

    def export(self, directory: str) -> dict:
        """Export the model (after ``--early-stop`` the best one) -> what it holds (``_export``)."""
        return _export.export_trained(directory, self.coll.main, self.store, self.model, self._model_meta(),
                                      self.control, self.log)

    def close(self) -> None:
        """Close the SSD-PS and remove it with the directories this job made (unless --keep-ssd).
        Idempotent."""
        if getattr(self, "dense_sync", None) is not None:
            self.dense_sync.close()
        if self.store is not None:
            self.store.close()
        kept = self._ssd.release()
        if kept is not None:
            self.log(f"SSD-PS kept in {kept} (--keep-ssd)")


_DEFAULT_BUDGET = 256 << 20


def _array_module(device: str):
    """NumPy for "cpu"; for "cuda" CuPy, or NumPy under the CUDA simulator (``hps._xp.array_module``)."""
    from .._xp import array_module  # imported here: this function is the trainer's only seam to it

    return array_module(device)


def _progress(enabled: bool, total, initial):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="ex", unit_scale=True, dynamic_ncols=True, leave=False)
