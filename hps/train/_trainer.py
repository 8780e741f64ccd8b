"""``Trainer``: wires data, tiers, model and collectives into the 4-stage pipeline (Algorithm 1).

Stages (threads joined by bounded queues, ``hps.pipeline``); under MPI every stage that communicates
has its own duplicate of the job's communicator (``_collectives``):

1. ``read``    parse this rank's next local batch — its shards of the data only (``_feed``) — and
               agree with the other ranks on the size of every global mini-batch and on where the
               epoch ends (one small all-reduce per batch);
2. ``prepare`` plan the mini-batches and find the keys this rank holds resident for the batch
               (``_sync``: keys sent to their owners, or gathered from every rank); evict what left
               the residency window and fetch the rest from MEM-PS/SSD-PS;
3. ``place``   insert the fetched rows into HBM-PS;
4. ``train``   per global mini-batch: rows -> forward/backward on this rank's examples -> summed
               gradient of every key -> one optimizer step per key -> dense all-reduce and step.
               Checkpoints happen here, at batch boundaries.

Not thread-safe: one Trainer per process, driven by one caller.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

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
from . import _checkpoint, _fae, _warmup
from ._budget import plan_memory
from ._collectives import Collectives
from ._feed import Feed, LocalBatch, empty_batch
from ._hierarchy import ParameterHierarchy, _host, make_hbm
from ._preflight import check_memory
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
        self.feed = feed or Feed(cfg, self.coll.rank, self.coll.size)
        check_memory(self.feed.n_fields, self.feed.n_dense, cfg, self.coll.size)
        mcfg = ModelConfig.from_options(m, self.feed.n_fields, self.feed.n_dense, cfg.train.seed)
        self.model = make_model(mcfg, xp=self.xp)
        self.sparse_opt, self.dense_opt = make_optimizers(mcfg)
        self.row_params = self.model.row_params  # leading row columns the model trains; state follows
        self.row_width = self.sparse_opt.row_width(self.row_params)
        self.initializer = RowInitializer(self.row_params, self.row_width, cfg.train.seed, m.init_scale,
                                          state_value=self.sparse_opt.initial_state_value)
        self.sync = make_sync(cfg.train.sparse_sync, self.coll, self.model, self.sparse_opt, self.row_params,
                              self.xp)
        self.store = None
        # this job's own directory (never one another job or the user holds), removed by close()
        self._ssd = SSDDir.claim(t.ssd_path, self.coll.rank, self.coll.size, keep=t.keep_ssd)
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
            it = self.feed.epoch()
            cur = next(it, None)
            b = 0
            while True:
                nxt = next(it, None)
                local = cur if cur is not None else self.feed.empty()
                hot = None
                if self.fae is not None:  # FAE: regroup into all-cold and all-hot mini-batches
                    local, hot = self.fae.split(local, ch)
                n_total, more = ch.agree(local.counts, nxt is not None)
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

    def _ensure_hierarchy(self):
        if self.hier is not None:
            return
        t = self.cfg.tiers
        hbm = make_hbm(self.plan.hbm_keys, self.row_width, t.device, t.n_parts)
        pull = self.coll.prepare.pull_rows if self.sync.replicated else None
        self.hier = ParameterHierarchy(hbm, self.memps, WINDOW, self.coll.owned_mask, pull)
        self.hier.mark_trained(self.start_index - 1)  # resumed: the batches before were trained

    def _gate(self, w: Work) -> None:
        if self.hier is not None:
            self.hier.wait_ready(w.index, self.pipeline.stop_event)

    def _prepare(self, w: Work) -> Work:
        resident, w.plans = self.sync.plan(w.local, self.fae.hot if self.fae is not None else None)
        self._ensure_hierarchy()
        w.prepared = self.hier.prepare(w.index, resident)
        self.peak_resident = max(self.peak_resident, self.hier.resident)
        return w

    def _place(self, w: Work) -> Work:
        try:
            self.hier.place(w.prepared)
        except HashTableFullError as e:
            raise HashTableFullError(f"{e} (HBM-PS holds the working sets of {WINDOW + 1} batches: raise "
                                     "--hbm-capacity or lower --batch-size)") from None
        return w

    def _train(self, w: Work) -> dict:
        loss_sum = 0.0
        fae = self.fae
        order = range(len(w.plans)) if fae is None else fae.order(w.n_total, w.hot, lambda: _fae.held_out_loss(self))
        for j in order:
            n = int(w.n_total[j])
            if n == 0:
                continue  # every shard had run out
            hot_mb = fae is not None and bool(w.hot[j])
            loss, g_dense = self.sync.step(self.hier.hbm, w.index, w.plans[j], w.local.minibatch(j), n,
                                           hot=fae.hot if fae is not None else None, hot_only=hot_mb)
            self._dense_step(g_dense)
            loss_sum += loss * n
            if fae is not None:
                fae.count(hot_mb, n, loss)
        n_ex = int(w.n_total.sum())
        loss_sum = self.coll.train.allsum(loss_sum)
        if not math.isfinite(loss_sum):
            raise NumericalError(f"training loss became {loss_sum} at epoch {w.epoch} batch {w.batch}; "
                                 "lower --lr/--dense-lr or check the data for inf/NaN features")
        self.hier.mark_trained(w.index)
        self._maybe_checkpoint(w)
        return {"index": w.index, "loss": loss_sum / max(n_ex, 1), "examples": n_ex}

    def _dense_step(self, grads: dict) -> None:
        names = list(grads)
        if self.coll.size > 1:
            flat = np.concatenate([_host(grads[k]).ravel() for k in names])
            flat = self.coll.train.dense_allreduce(flat)
            off = 0
            for k in names:
                n = grads[k].size
                grads[k] = self.xp.asarray(flat[off:off + n].reshape(grads[k].shape))
                off += n
        self.dense_opt.step(self.model.params, grads)

    # -- checkpoints ------------------------------------------------------------------------------------
    def _maybe_checkpoint(self, w: Work) -> None:
        tc = self.cfg.train
        if not tc.checkpoint_dir:
            return
        due = tc.checkpoint_every and (w.index + 1) % tc.checkpoint_every == 0
        if due or w.last_in_epoch:
            self.save_checkpoint(w.index, w.epoch, w.batch)

    def save_checkpoint(self, index: int, epoch: int, batch: int) -> str:
        """Write a checkpoint after batch ``index``. Collective over the train channel: call it from
        the train stage (or after training)."""
        meta = {"index": index, "epoch": epoch, "batch": batch}
        if self.fae is not None:  # pinned hot rows go through MEM-PS/SSD-PS like every other row
            self.fae.hot.write_back(self.memps, self.coll.owned_mask)
            meta["fae"] = self.fae.state(self.coll.train)
        self.hier.sync_to_store()
        tc = self.cfg.train
        return _checkpoint.save(tc.checkpoint_dir, self.coll.train, self.store, self.model, self.dense_opt,
                                meta, keep=tc.keep_checkpoints)

    def resume(self) -> None:
        meta = _checkpoint.load(self.cfg.train.checkpoint_dir, self.coll.main, self.store, self.model,
                                self.dense_opt, warn=lambda msg: self.log(f"hps: warning: {msg}"))
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
        the kernels are compiled first (``_warmup``), outside the timed part."""
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
                                 stop_timeout_s=MPI_STOP_TIMEOUT_S if self.coll.size > 1 else STOP_TIMEOUT_S)
        t0, c0 = time.perf_counter(), time.process_time()
        examples = 0

        last_bar = [0.0]

        def sink(res):
            nonlocal examples
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

    def evaluate(self, batches=None) -> dict:
        """AUC and logloss on ``batches`` (default: this rank's shards of the eval data; synthetic: its
        eval split), on rank 0; {} without eval data. Every rank predicts its own batches with rows
        pulled from their owners (main channel); labels and probabilities are gathered on rank 0.
        Collective (ranks may hold different numbers of batches)."""
        if batches is None:
            if not self.feed.has_eval:
                return {}
            batches = self.feed.eval_batches()
        batches = iter(batches)
        # nothing trained in this run (resumed after the last batch): the rows are in the tiers
        self._ensure_hierarchy()
        ch, P = self.coll.main, self.row_params
        labels, probs = [], []
        while True:
            batch = next(batches, None)
            if not ch.any(batch is not None):
                break
            if batch is None:
                batch = empty_batch(self.feed.n_fields, self.feed.n_dense)
            keys, inv = unique_inverse(batch.keys)
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
                "ssd_rows_loaded": self.memps.stats()["ssd_loads"],
                "ssd": {k: st[k] for k in ("bytes_read", "bytes_written", "disk_bytes", "files", "live_rows")}}

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
        return {
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
            "mpi_wait": self.coll.wait_mode,
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
        }

    def describe_model(self) -> str:
        """One line: the architecture, its dense parameter count and the layout of an embedding row."""
        m = self.model
        dense = sum(int(p.size) for p in m.params.values())
        state = self.row_width - self.row_params
        row = (f"{m.emb_dim} embedding" + (" + 1 first-order weight" if m.first_order else "")
               + (f" + {state} {self.sparse_opt.name} state" if state else ""))
        return (f"model: {m.describe()}; {dense:,} dense parameters ({self.dense_opt.name}); "
                f"one row of {self.row_width} floats ({row}) per key, made on first use")

    def export(self, directory: str) -> None:
        _checkpoint.export(directory, self.coll.main, self.store, self.model)

    def close(self) -> None:
        """Close the SSD-PS and remove it with the directories this job made (unless --keep-ssd).
        Idempotent."""
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
