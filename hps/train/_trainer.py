"""``Trainer``: wires data, tiers, model and collectives into the 4-stage pipeline (Algorithm 1).

Stages (threads joined by bounded queues, ``hps.pipeline``):

1. ``read``    parse the next global batch (every rank reads the whole global batch: sizes are global);
2. ``prepare`` working set = unique keys of the global batch; evict what left the residency window
               and fetch the rest from MEM-PS/SSD-PS (own keys) or from their owner ranks; plan the
               mini-batches (this rank's share of each global mini-batch, unique keys, inverse);
3. ``place``   insert the fetched rows into HBM-PS;
4. ``train``   per mini-batch: rows from HBM-PS -> forward/backward -> sparse + dense all-reduce ->
               one optimizer step per key -> rows back into HBM-PS. Checkpoints happen here, at batch
               boundaries.

Not thread-safe: one Trainer per process, driven by one caller.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..config import Config
from ..data import open_dataset
from ..errors import HashTableFullError, InternalError, InvalidInputError, NumericalError
from ..mem import MemPS, RowInitializer, unique_counts
from ..metrics import auc as auc_score
from ..metrics import logloss as logloss_score
from ..model import ModelConfig, make_model, make_optimizers
from ..pipeline import STOP_TIMEOUT_S, Pipeline, Stage
from ..ssd import ScratchEnv, SSDOptions, SSDStore
from . import _checkpoint, _warmup
from ._budget import plan_memory
from ._collectives import LocalCollectives
from ._hierarchy import ParameterHierarchy, _host, make_hbm
from ._preflight import check_memory
from ._ssd_dir import SSDDir

#: prepare(i) waits for train(i - WINDOW); keys unused for WINDOW batches leave HBM-PS.
WINDOW = 3
#: Under MPI, how long a stopping pipeline waits for its stages: one may be blocked for good in a
#: collective that its peers, stopped by the same signal a batch earlier, never join.
MPI_STOP_TIMEOUT_S = 10.0


@dataclass
class MiniBatch:
    share: object          # this rank's Batch share of the global mini-batch
    keys: np.ndarray       # (u,) distinct keys of the share, in first-occurrence order
    inv: np.ndarray        # (nnz,) index into keys of each key occurrence
    n_total: int           # examples in the global mini-batch


@dataclass
class Work:
    epoch: int
    batch: int             # index within the epoch
    index: int             # global batch counter (resume-stable)
    data: object           # the global Batch
    last_in_epoch: bool = False
    minibatches: list | None = None
    prepared: object | None = None


def share_bounds(n: int, rank: int, size: int) -> tuple[int, int]:
    """Contiguous share ``rank`` of ``n`` items split ``size`` ways (first shares one longer)."""
    q, r = divmod(n, size)
    start = rank * q + min(rank, r)
    return start, start + q + (1 if rank < r else 0)


def _unique_inverse(keys):
    """(distinct keys in first-occurrence order, inverse) — hashing, not sorting (3-4x np.unique)."""
    u, _, inv = unique_counts(keys)
    return u, inv


class Trainer:
    """Train a CTR model over the three tiers. ``coll``: LocalCollectives (default) or MpiCollectives."""

    def __init__(self, cfg: Config, coll=None, log=print):
        self.cfg = cfg
        self.coll = coll or LocalCollectives()
        self.log = log if self.coll.rank == 0 else (lambda *a, **k: None)
        d, m, t = cfg.data, cfg.model, cfg.tiers
        self.xp = _array_module(t.device)
        opts = _format_options(d, cfg.train.seed)
        read = {"strict": d.strict, "max_malformed": d.max_malformed}
        self.dataset = open_dataset(d.data, d.format, cfg.train.batch_size, **read, **opts)
        self.eval_dataset = None
        if d.eval_data:
            eval_opts = {k: v for k, v in opts.items() if k != "seed"}
            if d.format == "libsvm":  # positional fields: the eval data has the training data's
                eval_opts["n_fields"] = self.dataset.n_fields
            self.eval_dataset = open_dataset(d.eval_data, d.format, cfg.train.batch_size, **read,
                                             **eval_opts)
            _check_same_layout(self.dataset, self.eval_dataset, d.data, d.eval_data)
        for ds in (self.dataset, self.eval_dataset):  # unusable data fails now, not after training
            if ds is not None:
                ds.probe()
        check_memory(self.dataset.n_fields, self.dataset.n_dense, cfg, self.coll.size)
        mcfg = ModelConfig.from_options(m, self.dataset.n_fields, self.dataset.n_dense, cfg.train.seed)
        self.model = make_model(mcfg, xp=self.xp)
        self.sparse_opt, self.dense_opt = make_optimizers(mcfg)
        self.row_params = self.model.row_params  # leading row columns the model trains; state follows
        self.row_width = self.sparse_opt.row_width(self.row_params)
        self.initializer = RowInitializer(self.row_params, self.row_width, cfg.train.seed, m.init_scale,
                                          state_value=self.sparse_opt.initial_state_value)
        self.store = None
        # this job's own directory (never one another job or the user holds), removed by close()
        self._ssd = SSDDir.claim(t.ssd_path, self.coll.rank, self.coll.size, keep=t.keep_ssd)
        self.ssd_dir = self._ssd.store_path
        try:
            ws, owned = self._first_working_set()
            self.plan = plan_memory(t.mem_budget or _DEFAULT_BUDGET, self.row_width, owned, ws, window=WINDOW,
                                    device=t.device, n_parts=t.n_parts, hbm_capacity=t.hbm_capacity,
                                    rows_per_file=t.rows_per_file)
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
        self.start_index = 0
        self.history = {"loss": []}

    def _first_working_set(self) -> tuple[int, int]:
        """Distinct keys of the first global batch, and how many of them this rank owns (the
        working set the memory plan is checked against before training starts)."""
        first = next(iter(self.dataset.batches()), None)
        if first is None:
            return 0, 0
        keys = _unique_inverse(first.keys)[0]
        return keys.shape[0], int(self.coll.owned_mask(keys).sum())

    # -- stages ---------------------------------------------------------------------------------------------
    def _source(self):
        """Global batches in order, each knowing whether it ends its epoch (one batch of lookahead)."""
        index = 0
        for epoch in range(self.cfg.train.epochs):
            pending = None
            for b, batch in enumerate(self.dataset.batches()):
                if pending is not None:
                    yield pending
                pending = Work(epoch, b, index, batch) if index >= self.start_index else None
                index += 1
            if pending is not None:
                pending.last_in_epoch = True
                yield pending

    def _ensure_hierarchy(self):
        if self.hier is not None:
            return
        t = self.cfg.tiers
        hbm = make_hbm(self.plan.hbm_keys, self.row_width, t.device, t.n_parts)
        self.hier = ParameterHierarchy(hbm, self.memps, self.coll, WINDOW)

    def _gate(self, w: Work) -> None:
        if self.hier is not None:
            self.hier.wait_ready(w.index, self.pipeline.stop_event)

    def _prepare(self, w: Work) -> Work:
        keys = _unique_inverse(w.data.keys)[0]
        self._ensure_hierarchy()
        w.prepared = self.hier.prepare(w.index, keys)
        w.minibatches = self._plan(w.data)
        return w

    def _plan(self, batch) -> list[MiniBatch]:
        mbs = []
        size = self.cfg.train.minibatch_size
        for a in range(0, len(batch), size):
            b = min(a + size, len(batch))
            s0, s1 = share_bounds(b - a, self.coll.rank, self.coll.size)
            share = batch.slice(a + s0, a + s1)
            keys, inv = _unique_inverse(share.keys)
            mbs.append(MiniBatch(share, keys, inv, b - a))
        return mbs

    def _place(self, w: Work) -> Work:
        try:
            self.hier.place(w.prepared)
        except HashTableFullError as e:
            raise HashTableFullError(f"{e} (HBM-PS holds the working sets of {WINDOW + 1} batches: raise "
                                     "--hbm-capacity or lower --batch-size)") from None
        return w

    def _train(self, w: Work) -> dict:
        hbm, P = self.hier.hbm, self.row_params
        loss_sum, n_ex = 0.0, 0
        for mb in w.minibatches:
            rows, found = hbm.get(mb.keys)
            rows = _host(rows)
            if not found.all():
                raise InternalError(f"batch {w.index}: {int((~found).sum())} working-set keys missing from "
                                    "HBM-PS (residency bug)")
            loss, _, g_rows, g_dense = self.model.forward_backward(self.xp.asarray(rows[:, :P]), mb.inv,
                                                                   mb.share, n_total=mb.n_total)
            keys, grads = self.coll.sparse_allreduce(mb.keys, _host(g_rows))
            if keys is not mb.keys:
                rows = _host(hbm.get(keys)[0])
            hbm.insert(keys, _host(self.sparse_opt.apply(rows, grads)))
            self._dense_step(g_dense)
            loss_sum += loss * mb.n_total
            n_ex += mb.n_total
        loss_sum = self.coll.allsum(loss_sum)
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
            flat = self.coll.dense_allreduce(flat)
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
        self.hier.sync_to_store()
        tc = self.cfg.train
        return _checkpoint.save(tc.checkpoint_dir, self.coll, self.store, self.model, self.dense_opt,
                                {"index": index, "epoch": epoch, "batch": batch}, keep=tc.keep_checkpoints)

    def resume(self) -> None:
        meta = _checkpoint.load(self.cfg.train.checkpoint_dir, self.coll, self.store, self.model,
                                self.dense_opt, warn=lambda msg: self.log(f"hps: warning: {msg}"))
        self.start_index = meta["index"] + 1
        self.log(f"resumed from {meta['path']} (after batch {meta['index']}, epoch {meta['epoch']})")

    # -- run ----------------------------------------------------------------------------------------------
    def fit(self, warm_up: bool = True) -> dict:
        """Train every batch (after the checkpoint, with ``resume``) -> :meth:`metrics`. With ``warm_up``
        the kernels are compiled first (``_warmup``), outside the timed part."""
        tc = self.cfg.train
        if tc.resume:  # first: a missing or damaged checkpoint is reported before the warm-up's compile
            self.resume()
        self.warmup_seconds = _warmup.warm_up(self, self.log) if warm_up else 0.0
        rows = getattr(self.dataset, "rows", None)  # known for synthetic data; files stream
        total = rows * tc.epochs if isinstance(rows, int) else None
        bar = _progress(tc.progress and self.coll.rank == 0, total, self.start_index * tc.batch_size)
        stop_timeout = MPI_STOP_TIMEOUT_S if self.coll.size > 1 else STOP_TIMEOUT_S
        self.pipeline = Pipeline("read", self._source(), [Stage("prepare", self._prepare, gate=self._gate),
                                                           Stage("place", self._place),
                                                           Stage("train", self._train)],
                                 depth=tc.queue_depth, stop_timeout_s=stop_timeout)
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
        if self.hier is not None:
            self.hier.drop_all()
        elif tc.resume:
            self.log(f"nothing left to train: the checkpoint is past the last batch of --epochs {tc.epochs}")
        return self.metrics()

    def evaluate(self, batches=None) -> dict:
        """AUC and logloss on ``batches`` (default: the eval data; synthetic: its eval split), on rank 0;
        {} without eval data. Collective."""
        if batches is None:
            batches = (self.dataset.eval_batches() if hasattr(self.dataset, "eval_batches") and not self.eval_dataset
                       else (self.eval_dataset.batches() if self.eval_dataset else None))
        if batches is None:
            return {}
        labels, probs = [], []
        for batch in batches:
            keys, inv = _unique_inverse(batch.keys)
            # nothing trained in this run (resumed after the last batch): the rows are in the tiers
            self._ensure_hierarchy()
            rows = self.hier.lookup(keys)
            s0, s1 = share_bounds(len(batch), self.coll.rank, self.coll.size)
            share = batch.slice(s0, s1)
            idx = inv[batch.offsets[s0]:batch.offsets[s1]]
            p = _host(self.model.predict(self.xp.asarray(rows[:, :self.row_params]), idx, share))
            labels.append(share.labels)
            probs.append(p)
        lab = self.coll.gather(np.concatenate(labels))
        pr = self.coll.gather(np.concatenate(probs))
        if self.coll.rank != 0:
            return {}
        out = {"auc": auc_score(lab, pr), "logloss": logloss_score(lab, pr),
               "eval_examples": int(lab.shape[0])}
        if self.eval_dataset is not None:
            st = self.eval_dataset.stats
            out.update(eval_malformed_lines=st.malformed, eval_malformed_first=st.first_malformed())
        return out

    def metrics(self) -> dict:
        """Job metrics; SSD-PS figures are summed over ranks, cache figures are this rank's. Collective."""
        st = {k: int(self.coll.allsum(v)) for k, v in self.store.stats().items()
              if k in ("bytes_read", "bytes_written", "disk_bytes", "files", "live_rows")}
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
            "ssd_bytes_read": st["bytes_read"],
            "ssd_bytes_written": st["bytes_written"],
            "ssd_disk_bytes": st["disk_bytes"],
            "ssd_files": st["files"],
            "table_rows": st["live_rows"],
            "ssd_rows_loaded": int(self.coll.allsum(ms["ssd_loads"])),
            "sparse_parameters": st["live_rows"] * self.row_params,
            "dense_parameters": sum(int(p.size) for p in self.model.params.values()),
            "ranks": self.coll.size,
            "comm_seconds": self.coll.seconds,
            "loss_per_batch": self.history["loss"],
            "malformed_lines": self.dataset.stats.malformed,
            "malformed_first": self.dataset.stats.first_malformed(),
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
        _checkpoint.export(directory, self.coll, self.store, self.model)

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


def _format_options(d, seed: int) -> dict:
    if d.format == "synthetic":
        return {"rows": d.rows, "fields": d.fields, "vocab_per_field": d.vocab_per_field, "zipf": d.zipf,
                "n_dense": d.n_dense, "seed": seed}
    if d.format == "libsvm" and d.libsvm_fields:
        return {"n_fields": d.libsvm_fields}
    if d.format == "csv":
        return {"label": d.label_column}
    return {}


def _check_same_layout(train, ev, train_path, eval_path) -> None:
    if (ev.n_fields, ev.n_dense) != (train.n_fields, train.n_dense):
        raise InvalidInputError(f"--eval-data {eval_path} has {ev.n_fields} fields and {ev.n_dense} dense "
                                f"features, --data {train_path} has {train.n_fields} and {train.n_dense}")


def _progress(enabled: bool, total, initial):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="ex", unit_scale=True, dynamic_ncols=True, leave=False)
