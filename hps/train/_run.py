"""``run(cfg, comm)``: one training job end to end — train, evaluate, report, export."""

from __future__ import annotations

import json

from ..errors import InvalidInputError
from ._collectives import Collectives
from ._trainer import Trainer

#: Options every rank must share (they shape the collectives or the model); the others (data paths,
#: outputs, tiers) may differ between ranks.
SHARED_OPTIONS = {
    "data": ("format", "data_shards", "fields", "n_dense", "libsvm_fields", "label_column"),
    "model": None,  # all of them
    "train": ("batch_size", "minibatch_size", "epochs", "seed", "checkpoint_every", "resume",
              "ranks_per_node", "sparse_sync"),
}


def check_same_options(ch, cfg) -> None:
    """Raise InvalidInputError on every rank if the ranks were given different values of an option
    in :data:`SHARED_OPTIONS` (one allgather; they would otherwise meet in mismatched collectives)."""
    mine = {}
    for part, names in SHARED_OPTIONS.items():
        sub = getattr(cfg, part)
        for name in names or vars(sub):
            mine[name] = getattr(sub, name)
    every = ch.allgather_obj(mine)
    for name, value in mine.items():
        values = [r[name] for r in every]
        if any(v != values[0] for v in values):
            raise InvalidInputError(f"ranks were given different --{name.replace('_', '-')}: {values}")


def run(cfg, comm=None, log=print, on_fatal=None) -> dict:
    """Train per ``cfg``; under MPI pass the job's communicator. Returns the metrics dict (rank 0).
    ``on_fatal``: see :class:`Trainer`."""
    coll = Collectives(comm, cfg.train.ranks_per_node, cfg.train.mpi_wait,
                       hierarchical=cfg.train.sparse_sync == "allreduce")
    check_same_options(coll.main, cfg)
    say = log if coll.rank == 0 else (lambda *a, **k: None)
    trainer = Trainer(cfg, coll, log=say, on_fatal=on_fatal)
    try:
        synthetic = trainer.feed.synthetic
        bayes = synthetic.bayes_auc() if synthetic is not None and coll.rank == 0 else None
        say(f"hps: training {cfg.data.format} data on {cfg.tiers.device}, {coll.size} rank(s) "
            f"({trainer.feed.n_shards} data shard(s), sparse sync {cfg.train.sparse_sync}, MPI wait "
            f"{coll.wait_mode}), batch {cfg.train.batch_size}, mini-batch {cfg.train.minibatch_size}, "
            f"MEM-PS budget {trainer.memps.cache.budget_bytes / 2**20:.0f} MiB, SSD-PS {trainer.ssd_dir}")
        metrics = trainer.fit()
        metrics.update(trainer.evaluate())
        if bayes is not None:
            metrics["bayes_auc"] = bayes
        metrics["bytes_sent_per_example"] = {k: v / max(metrics["examples"], 1)
                                             for k, v in metrics["bytes_sent"].items()}
        if cfg.train.export:
            trainer.export(cfg.train.export)
        if coll.rank == 0:
            say(report(metrics))
            if cfg.train.metrics_out:
                with open(cfg.train.metrics_out, "w") as f:
                    json.dump(metrics, f, indent=1, default=float)
            if cfg.train.plots:
                from ._plots import draw

                draw(metrics, cfg.train.plots)
        return metrics
    finally:
        trainer.close()


def report(m: dict) -> str:
    lines = []
    if "auc" in m:
        best = f" (best achievable {m['bayes_auc']:.4f})" if "bayes_auc" in m else ""
        lines.append(f"eval AUC {m['auc']:.4f}{best}  logloss {m['logloss']:.4f}  on {m['eval_examples']} examples")
    lines.append(f"trained {m['examples']} examples in {m['train_seconds']:.1f} s: "
                 f"{m['examples_per_sec']:,.0f} examples/s on {m['ranks']} rank(s)")
    lines.append("stage busy seconds (Figure 3c): " + ", ".join(
        f"{k} {v:.2f}" for k, v in m["stage_seconds"].items()) + f"; bottleneck: {m['bottleneck']}")
    lines.append(f"MEM-PS cache hit rate {m['cache_hit_rate']:.3f}; SSD-PS read {m['ssd_bytes_read'] / 2**20:.1f} MiB, "
                 f"wrote {m['ssd_bytes_written'] / 2**20:.1f} MiB, disk {m['ssd_disk_bytes'] / 2**20:.1f} MiB "
                 f"in {m['ssd_files']} files")
    if m["ranks"] > 1:
        per_ex = ", ".join(f"{k} {v:.0f}" for k, v in m["bytes_sent_per_example"].items() if v)
        lines.append(f"bytes sent per example (all ranks): {per_ex}; rank 0 in MPI {m['comm_seconds']:.1f} s")
        lines.append("per rank: MB parsed " + " ".join(f"{b / 1e6:.1f}" for b in m["bytes_parsed"])
                     + "; resident rows " + " ".join(str(r) for r in m["resident_rows"])
                     + "; busiest stage CPU s " + " ".join(f"{max(c.values()):.1f}" for c in m["stage_cpu_seconds"]))
    return "\n".join(lines)
