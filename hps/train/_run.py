"""``run(cfg, comm)``: one training job end to end — train, evaluate, report, export."""

from __future__ import annotations

import json
import time

from ..errors import InvalidInputError
from ..formats import _checkpoint
from ._collectives import Collectives
from ._control import summary as control_summary
from ._inputs import check_same_inputs
from ._preflight import check_outputs
from ._records import run_record
from ._trainer import Trainer

#: Options every rank must share (they shape the collectives or the model); the others (data paths,
#: outputs, tiers) may differ between ranks.
SHARED_OPTIONS = {
    "data": ("format", "data_shards", "fields", "n_dense", "libsvm_fields", "label_column", "ignore_columns",
             "dense_columns", "categorical_columns", "int_as_categorical", "drift", "op_osrp", "dense_transform"),
    "model": None,  # all of them
    "train": ("batch_size", "minibatch_size", "epochs", "seed", "checkpoint_every", "resume",
              "ranks_per_node", "sparse_sync",
              # admission, expiry, training control
              "admit_after", "admit_sketch_width", "expire_after", "eval_every", "early_stop", "lr_warmup",
              "lr_decay", "lr_decay_steps", "shuffle_buffer",
              "consistency", "staleness", "het_policy",
              # Hierarchical Training (KDD 2021 §3.1), compression
              "dense_sync", "groups", "easgd_alpha", "easgd_every", "compress",
              # FAE (seeds/003 §4)
              "fae", "hot_bytes", "fae_sample_rate", "fae_holdout"),
}


def check_same_options(ch, cfg) -> None:
    """Raise InvalidInputError on every rank if the ranks were given different values of an option
    in :data:`SHARED_OPTIONS` (one allgather; they would otherwise meet in mismatched collectives)."""
    mine = {}
    for part, names in SHARED_OPTIONS.items():
        sub = getattr(cfg, part)
        for name in names or vars(sub):
            mine[name] = getattr(sub, name)
    every = ch.allgather(mine)
    for name, value in mine.items():
        values = [r[name] for r in every]
        if any(v != values[0] for v in values):
            raise InvalidInputError(f"ranks were given different --{name.replace('_', '-')}: {values}")


def run(cfg, comm=None, log=print, on_fatal=None) -> dict:
    """Train per ``cfg``; under MPI pass the job's communicator. Returns the metrics dict (rank 0).
    ``on_fatal``: see :class:`Trainer`."""
    coll = Collectives(comm, cfg.train.mpi_wait)
    check_same_options(coll.main, cfg)
    check_same_inputs(coll.main, cfg)  # the same files on every rank, or byte-range shards go wrong
    say = log if coll.rank == 0 else (lambda *a, **k: None)
    check_outputs(cfg.train)
    with _checkpoint.locked(cfg.train.checkpoint_dir, coll.main):  # one job per --checkpoint-dir
        metrics = _train(cfg, coll, say, log, on_fatal)
    coll.close()  # its communicators (a job that failed keeps them: a rank gone would not free its own)
    return metrics


def _train(cfg, coll, say, log, on_fatal) -> dict:
    """:func:`run`'s job, its checks made and its checkpoint directory held."""
    started = time.time()
    trainer = Trainer(cfg, coll, log=log, on_fatal=on_fatal)  # it says most things on rank 0 only
    try:
        synthetic = trainer.feed.synthetic
        bayes = synthetic.bayes_auc() if synthetic is not None and coll.rank == 0 else None
        say(f"hps: training {cfg.data.format} data on {cfg.tiers.device}, {coll.size} rank(s) "
            f"({trainer.feed.n_shards} data shard(s), sparse sync {cfg.train.sparse_sync}, MPI wait "
            f"{coll.wait_mode}, BLAS threads {trainer.blas_threads}, readers {trainer.feed.reader_threads}), batch {cfg.train.batch_size}, mini-batch {cfg.train.minibatch_size}, "
            f"MEM-PS cache {trainer.memps.cache.capacity_rows:,} rows, SSD-PS {trainer.ssd_dir}")
        for w in trainer.feed.warnings:
            say(f"hps: warning: {w}")
        tc = cfg.train
        if tc.checkpoint_every and not tc.checkpoint_dir and tc.consistency != "het":  # het: it sets the cuts
            say("hps: warning: --checkpoint-every without --checkpoint-dir writes no checkpoint")
        say(trainer.describe_model())
        metrics = trainer.fit()
        exported = None
        if cfg.train.export:  # before evaluating: a bad eval file must not cost the trained model
            exported = trainer.export(cfg.train.export)  # after --early-stop: the best model (_control)
        metrics.update(trainer.evaluate())
        if bayes is not None:
            metrics["bayes_auc"] = bayes
        metrics["bytes_sent_per_example"] = {k: v / max(metrics["examples"], 1)
                                             for k, v in metrics["bytes_sent"].items()}
        metrics.update(run_record(cfg, started))  # config, hps version, data files, run name
        if exported is not None:
            metrics["exported"] = exported
        if coll.rank == 0:
            say(report(metrics))
            if cfg.train.metrics_out:
                with open(cfg.train.metrics_out, "w") as f:
                    json.dump(metrics, f, indent=1, default=float)
            plots = []
            if cfg.train.plots:
                from ._plots import draw

                plots = draw(metrics, cfg.train.plots)
            say(outputs(cfg, plots))
        return metrics
    finally:
        trainer.close()


def report(m: dict) -> str:
    """The end-of-run summary of the metrics ``m`` (several lines)."""
    lines = []
    if "auc" in m:
        best = f" (best achievable {m['bayes_auc']:.4f})" if "bayes_auc" in m else ""
        lines.append(f"eval AUC {m['auc']:.4f}{best}  logloss {m['logloss']:.4f}  on {m['eval_examples']} examples")
    else:
        lines.append("no eval data: no AUC computed (give --eval-data FILE)")
    ex = m.get("exported")
    if ex and ex["best"]:
        lines.append(f"the export holds the best model, after batch {ex['batch']} (eval AUC {ex['eval_auc']:.4f}); "
                     "the evaluation above is of the model at the end of training")
    lines.append(f"trained {m['examples']} examples in {m['train_seconds']:.1f} s: "
                 f"{m['examples_per_sec']:,.0f} examples/s on {m['ranks']} rank(s) "
                 f"(not counting {m['warmup_seconds']:.1f} s of kernel warm-up)")
    lines.append(f"model size: {m['table_rows']:,} keys, {m['sparse_parameters']:,} embedding parameters, "
                 f"{m['dense_parameters']:,} dense parameters")
    lines += control_summary(m)  # eval curve, early stop, admission/expiry
    for what, pre in (("training", ""), ("eval", "eval_")):
        if m.get(f"{pre}malformed_lines"):
            first = m[pre + "malformed_first"]
            lines.append(f"skipped {m[pre + 'malformed_lines']} malformed lines of the {what} data "
                         f"(per pass); first: {'; '.join(first[:3])}{'; …' if len(first) > 3 else ''}")
    lines.append("stage busy seconds (Figure 3c): " + ", ".join(
        f"{k} {v:.2f}" for k, v in m["stage_seconds"].items()) + f"; bottleneck: {m['bottleneck']}")
    lines.append(f"MEM-PS cache hit rate {m['cache_hit_rate']:.3f}; SSD-PS read {m['ssd_bytes_read'] / 2**20:.1f} MiB, "
                 f"wrote {m['ssd_bytes_written'] / 2**20:.1f} MiB, disk {m['ssd_disk_bytes'] / 2**20:.1f} MiB "
                 f"in {m['ssd_files']} files")
    if "het_hit_rate" in m:
        lines.append(f"HET (s = {m['staleness']}): cache hit rate {m['het_hit_rate']:.3f}, "
                     f"{m['het_fetches']:,} fetches, {m['het_pushes']:,} pushes, {m['het_invalidations']:,} invalidations, "
                     f"{m['het_evictions']:,} evictions (all ranks)")
    if m["ranks"] > 1:
        per_ex = ", ".join(f"{k} {v:.0f}" for k, v in m["bytes_sent_per_example"].items() if v)
        lines.append(f"bytes sent per example (all ranks): {per_ex}; rank 0 in MPI {m['comm_seconds']:.1f} s")
        lines.append("per rank: examples " + " ".join(f"{n:,}" for n in m["examples_per_rank"])
                     + "; MB parsed " + " ".join(f"{b / 1e6:.1f}" for b in m["bytes_parsed"])
                     + "; resident rows " + " ".join(str(r) for r in m["resident_rows"])
                     + "; busiest stage CPU s " + " ".join(f"{max(c.values()):.1f}" for c in m["stage_cpu_seconds"]))
    return "\n".join(lines)


def outputs(cfg, plots=()) -> str:
    """One line: where this run's outputs went (or that nothing was saved)."""
    from ..formats import last_checkpoint

    tc, parts = cfg.train, []
    if tc.export:
        parts.append(f"model {tc.export} (read it with hps.load_export)")
    if tc.checkpoint_dir and last_checkpoint(tc.checkpoint_dir) is not None:
        parts.append(f"checkpoint {last_checkpoint(tc.checkpoint_dir)} (continue with --resume "
                     f"--checkpoint-dir {tc.checkpoint_dir})")
    if tc.metrics_out:
        parts.append(f"metrics {tc.metrics_out}")
    if plots:
        parts.append(f"plots {', '.join(plots)}")
    if not parts:
        return "outputs: nothing saved (--export DIR keeps the model, --metrics-out FILE the metrics)"
    return "outputs: " + "; ".join(parts)
