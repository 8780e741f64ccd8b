"""``Trainer``: wires data, tiers, model and collectives into the 4-stage pipeline (Algorithm 1).

Stages (threads joined by bounded queues, ``hps.pipeline``); under MPI every stage that communicates
has its own duplicate of the job's communicator (``_collectives``):

1. ``read``    parse this rank's next local batch — its shards of the data only (``_feed``) — and
               agree with the other ranks on the size of every global mini-batch and on where the
               epoch ends (one small all-reduce per batch);
2. ``prepare`` plan the mini-batches and find the keys this rank holds resident for the batch
               (``_sync``: keys sent to their owners, or gathered from every rank); look them up in
               the HBM-PS (a cache across batches), evict its coldest rows if the misses need room
               under ``--hbm-budget``, fetch the misses from MEM-PS/SSD-PS and insert them (``_hierarchy``);
3. ``place``   stage the batch's inputs for the step (``_device_batch``: on ``--device cuda`` its
               plans made on the device from the raw arrays prepare uploaded, or one upload of them);
4. ``train``   per global mini-batch, one step written once over the array module (``_backend``):
               rows -> forward/backward on this rank's examples -> summed gradient of every key ->
               one optimizer step per key (``_sync``, ``_het_sync``) -> dense sync and step
               (``_dense_sync``, ``_easgd``). Checkpoints happen here, at batch boundaries.

The pieces are built apart (``_build``) and passed in; the features — admission/expiry, FAE, HET,
EASGD, the learning-rate schedule, training control — plug into the stages through the hooks of
``_features`` (the trainer calls every hook of every feature and has no branch of its own per feature).

Not thread-safe: one Trainer per process, driven by one caller.
"""

from __future__ import annotations

import math
import time
from functools import partial

import numpy as np

from .._xp import array_module
from ..config import Config
from ..errors import InvalidInputError, NumericalError, PipelineError
from ..formats import _checkpoint, _export
from ..mem import MemPS, RowInitializer
from ..metrics import auc as auc_score, logloss as logloss_score
from ..model import ModelConfig, make_model, make_optimizers
from ..pipeline import STOP_TIMEOUT_S, Pipeline, Stage, switch_interval
from ..ssd import ScratchEnv, SSDOptions, SSDStore
from . import _build, _warmup
from ._blas import DenseThreads
from ._budget import TwinBudget, check_batch_size, plan_job, resolve_budget
from ._collectives import STAGE_CHANNELS, Collectives
from ._control import best_dir
from ._device_batch import BatchPlanner, dedups_on_device
from ._features import Checkpoint
from ._feed import Feed, empty_batch
from ._hbm_budget import working_set_budget_rows
from ._hierarchy import WINDOW, ParameterHierarchy, _host, make_hbm
from ._inputs import check_resumed_stream, stream_record
from ._job_metrics import job_figures, rank_figures
from ._preflight import check_memory, first_working_set
from ._records import describe_model, export_meta
from ._ssd_dir import SSDDir
from ._sync import unique_inverse
from ._work import BatchJob, Start, Work

#: Under MPI, how long a stopping pipeline waits for its stages: one may be blocked for good in a
#: collective that its peers, stopped by the same signal a batch earlier, never join.
MPI_STOP_TIMEOUT_S = 10.0


class Trainer:
    """Train a CTR model over the three tiers. ``coll``: :class:`Collectives` (default: one process).
    ``on_fatal(error)``: called at once, from the failing thread, when a pipeline stage fails in an
    MPI job (the CLI aborts the job there, so no peer waits for this rank in a collective).
    ``feed``: the data (default: this rank's shards of ``cfg``'s data, :class:`Feed`).
    ``first_batch``: this rank's first local batch (a Batch, or None), parsed at construction for the
    memory plan and kept for the kernel warm-up; :meth:`fit` drops it. ``cache_rows``: fix the
    MEM-PS cache at this many rows instead of giving it the plan's MEM-PS tier (the warm-up's
    scratch job spills with it)."""

    def __init__(self, cfg: Config, coll=None, log=print, on_fatal=None, feed=None, cache_rows=None):
        self.cfg, self.on_fatal = cfg, on_fatal
        self.coll = coll or Collectives()
        self.log = log if self.coll.rank == 0 else (lambda *a, **k: None)
        m, t = cfg.model, cfg.tiers
        self.xp = array_module(t.device)  # NumPy, CuPy, or NumPy under the CUDA simulator
        # the dense model's host threads: --blas-threads, else sized between batches to idle cores (_blas)
        self.dense_threads = DenseThreads(cfg.train.blas_threads, self.coll.cores_per_rank)
        self.blas_threads = self.dense_threads.label
        # memory budget (_budget): resolved and checked against the batch size before any batch exists
        self.budget = resolve_budget(t.mem_budget, self.coll.ranks_on_node)
        check_batch_size(cfg.train.batch_size, cfg.train.minibatch_size, self.coll.size, cfg.train.queue_depth,
                         *self.budget)
        self.feed = feed or Feed(cfg, self.coll.rank, self.coll.size, self.coll.cores_per_rank)
        model_bytes = check_memory(self.feed.n_fields, self.feed.n_dense, cfg, self.coll.size, self.budget)
        mcfg = ModelConfig.from_options(m, self.feed.n_fields, self.feed.n_dense, cfg.train.seed)
        self.model = make_model(mcfg, xp=self.xp)
        self.sparse_opt, self.dense_opt = make_optimizers(mcfg)
        self.row_params = self.model.row_params  # leading row columns the model trains; state follows
        self.row_width = self.sparse_opt.row_width(self.row_params)
        self.initializer = RowInitializer(self.row_params, self.row_width, cfg.train.seed, m.init_scale,
                                          state_value=self.sparse_opt.initial_state_value)
        # the train step: its backend (what differs between the devices) and strategies, and the features
        self.backend = _build.backend(t, self.model, self.xp, self.coll)
        self.hot, self.sync, self.dense_sync = _build.step_strategies(
            cfg.train, cfg.data, self.coll, self.backend, self.sparse_opt, self.dense_opt, self.model.params,
            self.row_params, self.row_width)
        self.features = _build.features(cfg, self.coll, self.feed, self.sync, self.dense_sync, self.hot,
                                        (self.sparse_opt, self.dense_opt), self.row_width, self._predict, self.log)
        on_device = dedups_on_device(self.backend, self.features, self.coll.size)  # where keys are deduplicated
        self.planner = BatchPlanner(self.sync, self.backend, on_device)
        self.store = None
        # this job's own directory (never one another job or the user holds), removed by close()
        self._ssd = SSDDir.claim(t.ssd_path, self.coll.rank, self.coll.size, keep=t.keep_ssd, log=log)  # every rank
        self.ssd_dir = self._ssd.store_path
        try:
            # kept for the warm-up, which compiles on it instead of parsing the data again (fit drops it)
            self.first_batch, resident, owned = first_working_set(self.feed, self.coll, self.sync.replicated)
            self.plan = plan_job(self, resident, owned, model_bytes, WINDOW)
            rows, shared = self.plan.hbm_rows, self.sync.replicated and self.coll.size > 1
            self.hbm_rows = min(self.coll.main.allgather(rows)) if shared else rows  # allreduce: identical tables
            self.log(f"hps: {self.plan.describe()}")
            # SSD-PS is this run's scratch space (durability comes from checkpoints): no fsync per dump
            opts = SSDOptions(page_cache=t.ssd_page_cache, **self.plan.ssd_options())
            self.store = SSDStore(str(self.ssd_dir), self.row_width, dtype=np.float32,
                                  rows_per_file=t.rows_per_file, options=opts, env=ScratchEnv())
            tier = dict(budget_bytes=self.plan.tier_bytes) if cache_rows is None else dict(capacity_rows=cache_rows)
            self.memps = MemPS(self.store, self.row_width, initializer=self.initializer, **tier)
        except BaseException:  # a bad value or an interrupt: leave nothing behind
            self.close()
            raise
        self.hier = None  # built on the first batch, when the working-set size is known
        self.peak_resident = 0
        self.start_index, self.history, self.examples = 0, {"loss": []}, 0
        self.last_trained: int | None = None  # the last batch trained so far (the export's record)
        # where checkpoints go: --checkpoint-dir, or the export's private one for --early-stop's best
        self.checkpoint_dir = best_dir(cfg.train)
        self._stream = stream_record(cfg, self.feed) if self.checkpoint_dir else None  # what they record
        self._resumed = None   # meta of the checkpoint resume() loaded

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
                w = Work(epoch, b, index, cur if cur is not None else self.feed.empty())
                self.features.on_read(w, ch)  # e.g. FAE: all-cold and all-hot mini-batches
                w.n_total, more = ch.agree(w.local.counts, nxt is not None and not self.features.stops_reading(index))
                if not w.n_total.any():  # no shard holds an example (each was fine on its own)
                    raise InvalidInputError(f"no valid example in --data {self.cfg.data.data}: every one "
                                            f"of its {self.feed.n_shards} shards is empty")
                w.last_in_epoch = not more
                if index >= self.start_index:
                    yield w
                index += 1
                b += 1
                if not more:
                    break
                cur = nxt
            if self.features.stops_epochs(ch):  # e.g. early stopping: no next epoch
                return

    def _ensure_hierarchy(self):
        if self.hier is not None:
            return
        t = self.cfg.tiers
        hbm = self.backend.wrap(make_hbm(self.plan.hbm_keys, self.row_width, t.device, t.n_parts, t.gpus))
        pull = self.coll.prepare.pull_rows if self.sync.replicated else None
        grow = (TwinBudget(self.plan, self.memps, t.n_parts)   # the twin's growth is in the budget
                if t.device == "cpu" and self.memps.budget_bytes is not None else None)
        budget_for = None
        if self.plan.hbm_tracks:  # the default's floor follows the working sets, batch by batch, as the plan's
            budget_for = partial(working_set_budget_rows, window=WINDOW)
        self.hier = ParameterHierarchy(hbm, self.memps, WINDOW, self.coll.owned_mask, pull, self.hbm_rows, grow,
                                       budget_for)
        self.hier.mark_trained(self.start_index - 1)  # resumed: the batches before were trained

    def _gate(self, w: Work) -> None:
        self.hier.wait_ready(w.index, self.pipeline.stop_event)
        horizon = self.features.prepare_horizon(w)
        if horizon is not None:  # e.g. HET: nothing is prepared past a consistent cut
            self.hier.wait_ready(horizon, self.pipeline.stop_event)

    def _prepare(self, w: Work) -> Work:
        if self.features.skips(w.index, "prepare"):
            return w
        self.features.on_prepare(w)  # e.g. admission: keys not admitted become their field's shared key
        resident = self.planner.plan(w)  # the keys on the device (``_device_batch``) or the host's plans
        w.prepared = self.hier.prepare(w.index, resident)
        self.peak_resident = max(self.peak_resident, self.hier.resident)
        w.keep_state = self._checkpoint_due(w) or self.features.keeps_state(w.index)
        self.features.on_resident(w, resident)  # e.g. expiry: the owner's keys of this batch are used now
        return w

    def _place(self, w: Work) -> Work:
        if w.prepared is None:
            return w
        w.staged = self.planner.stage(w, self.hier.hbm)
        return w

    def _train(self, w: Work) -> dict:
        if self.features.skips(w.index, "train"):  # e.g. early stopping: not trained
            self.hier.mark_trained(w.index)
            return {"index": w.index, "loss": None, "examples": 0, "local_examples": 0}
        loss_sum = self._train_batch(w)
        n_ex = int(w.n_total.sum())
        loss_sum = self.coll.train.allsum(loss_sum)
        if not math.isfinite(loss_sum):
            raise NumericalError(f"training loss became {loss_sum} at epoch {w.epoch} batch {w.batch}; "
                                 "lower --lr/--dense-lr or check the data for inf/NaN features")
        self.features.end_batch(w)  # e.g. HET: a consistent cut flushes the caches
        self.dense_threads.after_batch(self.pipeline.stage_times())  # threads for the next batch
        held = self.features.holds_batch(w.index)  # e.g. control: prepare waits for the best checkpoint
        if not held:
            self.hier.mark_trained(w.index)
        job = BatchJob(self._evaluate_now, lambda: self.save_checkpoint(w.index, w.epoch, w.batch, w))
        self.features.after_batch(w, job)  # first (e.g. the eval curve): checkpoints hold its state
        if self._checkpoint_due(w):
            job.save()
        if held:
            self.hier.mark_trained(w.index)
        return {"index": w.index, "loss": loss_sum / max(n_ex, 1), "examples": n_ex,
                "local_examples": int(w.local.counts.sum())}

    def _train_batch(self, w: Work) -> float:
        """Train the mini-batches of ``w`` (in the features' order) -> this rank's sum of per-example
        losses. Collective over the train channel per mini-batch."""
        be, table, features = self.backend, self.hier.hbm, self.features
        be.begin_batch(table, w.staged)  # the device's train stream waits for the place stage's event
        for j in features.order(w):
            n = int(w.n_total[j])
            if n == 0:
                continue  # every shard had run out
            features.before_minibatch(w, j)
            g_dense = self.sync.step(be, table, w.plans[j], w.staged[j], n)
            self.dense_sync.step(g_dense, int(w.local.counts[j]), n)
            be.end_minibatch()
            features.after_minibatch(w, j, n, be.minibatch_loss)
        return be.end_batch(table)

    def _evaluate_now(self) -> tuple[float, float]:
        """(AUC, logloss) of the model as it is, the same on every rank (train channel)."""
        m = self.evaluate(ch=self.coll.train)
        auc, logloss = self.coll.train.allgather((m.get("auc"), m.get("logloss")))[0]
        return float(auc), float(logloss)

    def _predict(self, rows, inv, batch) -> np.ndarray:
        """Click probabilities (n,) host of ``batch`` over the parameter rows ``rows`` (u, P) xp."""
        return _host(self.model.predict(rows, inv, batch))

    # -- checkpoints ------------------------------------------------------------------------------------
    def _checkpoint_due(self, w: Work) -> bool:
        tc = self.cfg.train
        return bool(tc.checkpoint_dir) and bool(
            (tc.checkpoint_every and (w.index + 1) % tc.checkpoint_every == 0) or w.last_in_epoch)

    def save_checkpoint(self, index: int, epoch: int, batch: int, w: Work | None = None) -> str:
        """Write a checkpoint after batch ``index`` (``w``: that batch, with the state features took in its
        prepare). Collective over the train channel: call it from the train stage (or after training)."""
        ckpt = Checkpoint(index, {"index": index, "epoch": epoch, "batch": batch, "stream": self._stream})
        self.features.save(w, ckpt)  # e.g. FAE writes its hot rows back first: the store gets them below
        self.hier.sync_to_store()
        extra = (lambda h: [write(h) for write in ckpt.writers]) if ckpt.writers else None
        return _checkpoint.save(self.checkpoint_dir, self.coll.train, self.store, self.model, self.dense_opt,
                                ckpt.meta, keep=self.cfg.train.keep_checkpoints, extra=extra,
                                pinned=tuple(ckpt.pinned), model_meta=self._model_meta())

    def resume(self) -> None:
        meta = _checkpoint.load(self.cfg.train.checkpoint_dir, self.coll.main, self.store, self.model,
                                self.dense_opt, warn=lambda msg: self.log(f"hps: warning: {msg}"),
                                extra=self.features.read_checkpoint,
                                accept=lambda m, d: check_resumed_stream(m.get("stream"), self._stream, d, self.log))
        self.features.restore(meta)  # e.g. this rank's dense group copy, the eval curve
        self.start_index = meta["index"] + 1
        self._resumed = meta
        self.log(f"resumed from {meta['path']} (after batch {meta['index']}, epoch {meta['epoch']})")

    # -- run ----------------------------------------------------------------------------------------------
    def _stage_failed(self, stage: str, exc: BaseException) -> None:
        if self.on_fatal is not None and self.coll.size > 1:
            err = PipelineError(stage, f"{type(exc).__name__}: {exc}")
            err.__cause__ = exc
            self.on_fatal(err)

    def fit(self, warm_up: bool = True) -> dict:
        """Train every batch (after the checkpoint, with ``resume``) -> :meth:`metrics`. With ``warm_up``
        the kernels are compiled first (``_warmup``), outside the timed part. The dense model's threads
        are sized meanwhile (``_blas``: ``--blas-threads``), the GIL switch interval set (the backend's)."""
        with self.dense_threads.bound(self.model), \
                switch_interval(self.cfg.train.gil_switch_interval or self.backend.switch_interval):
            return self._fit(warm_up)

    def _fit(self, warm_up: bool) -> dict:
        tc = self.cfg.train
        if tc.resume:  # first: a missing or damaged checkpoint is reported before the warm-up's compile
            self.resume()
        self.warmup_seconds = _warmup.warm_up(self, self.log) if warm_up else 0.0
        self.first_batch = None
        self._ensure_hierarchy()
        self.features.start(Start(self.hier, self._resumed, self.log))  # e.g. FAE pins its hot rows
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
        self.local_examples = 0  # this rank's share of them (its shards' examples; rank_metrics)

        last_bar = [0.0]

        def sink(res):
            nonlocal examples
            if res["loss"] is None:  # not trained (early stopping)
                return
            examples += res["examples"]
            self.local_examples += res["local_examples"]
            self.last_trained = res["index"]
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
            self.features.finish()  # e.g. EASGD: every rank takes the centre copy; FAE writes back
        finally:
            self.hier.abort()
            if bar is not None:
                bar.close()
        self.train_seconds = time.perf_counter() - t0
        self.train_cpu_seconds = time.process_time() - c0  # every thread of the process
        self.examples = examples
        if self.cfg.tiers.keep_ssd or tc.export:  # readers of the store alone, counted in the metrics; else
            self.hier.drop_all()  # the resident rows stay in the HBM-PS (export() writes them back first)
        if tc.resume and not examples:
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
        self._ensure_hierarchy()  # none yet when nothing was trained in this run (resumed past the end)
        ch, P = ch or self.coll.main, self.row_params
        labels, probs = [], []
        while True:
            batch = next(batches, None)
            if not ch.any(batch is not None):
                break
            if batch is None:
                batch = empty_batch(self.feed.n_fields, self.feed.n_dense)
            keys, inv = unique_inverse(batch.keys)
            looked_up = self.features.eval_keys(keys, ch)  # e.g. admission: shared rows of keys not admitted
            if looked_up is not keys:
                keys, again = unique_inverse(looked_up)
                inv = again[inv]
            rows = ch.pull_owned(keys, self.hier.read_owned)
            labels.append(batch.labels)  # FAE: the pinned hot rows are newer than the tiers' copies
            probs.append(self._predict(self.hot.current(keys, rows[:, :P]), inv, batch))
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
        """This rank's figures (``_job_metrics.rank_figures``)."""
        return rank_figures(self.coll, self.pipeline, self.feed, self.store, self.memps, self.peak_resident,
                            self.backend.transfers, self.features.rank_metrics(), self.local_examples,
                            self.hier, self.hbm_rows)

    def metrics(self) -> dict:
        """Job metrics: the features', the training's and every rank's (``_job_metrics.job_figures``).
        Collective."""
        per = self.coll.main.allgather(self.rank_metrics())
        rows = sum(r["table_rows"] for r in per)
        return self.features.metrics([r["features"] for r in per]) | {
            "examples": self.examples,
            "train_seconds": self.train_seconds,
            "train_cpu_seconds": self.train_cpu_seconds,
            "warmup_seconds": self.warmup_seconds,
            "examples_per_sec": self.examples / self.train_seconds if self.train_seconds else 0.0,
            "sparse_parameters": rows * self.row_params,
            "dense_parameters": sum(int(p.size) for p in self.model.params.values()),
            "data_shards": self.feed.n_shards,
            "blas_threads": self.blas_threads,
            **self.dense_threads.metrics(),
            "loss_per_batch": self.history["loss"],
        } | job_figures(per, self.coll, self.pipeline, self.memps)

    def describe_model(self) -> str:
        """One line: the architecture, its dense parameter count and the layout of an embedding row."""
        return describe_model(self.model, self.row_width, self.sparse_opt.name, self.dense_opt.name)

    def _model_meta(self) -> dict:
        """The model and its input (``_records.export_meta``), for exports and checkpoints."""
        return export_meta(self.cfg, self.feed, self.model, getattr(self.feed, "format_options", {}))

    def export(self, directory: str) -> dict:
        """Export the model the features choose (after ``--early-stop`` the best one, else the model as
        it is) -> what it holds (``_export.export_trained``). Collective over the main channel."""
        choice = self.features.export_choice(self.last_trained)
        if self.hier is not None:  # fit leaves the resident rows in the HBM-PS: the store takes them first
            self.hier.drop_all()
        return _export.export_trained(directory, self.coll.main, self.store, self.model, self._model_meta(),
                                      choice, self.checkpoint_dir, self.log)

    def close(self) -> None:
        """Close the SSD-PS and remove it with the directories this job made (unless --keep-ssd).
        Idempotent."""
        if getattr(self, "features", None) is not None:
            self.features.close()
        if self.store is not None:
            self.store.close()
        kept = self._ssd.release()
        if kept is not None:
            self.log(f"SSD-PS kept in {kept} (--keep-ssd)")


def _progress(enabled: bool, total, initial):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="ex", unit_scale=True, dynamic_ncols=True, leave=False)
