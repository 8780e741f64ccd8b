"""``run(cfg, comm)``: one training job end to end — train, evaluate, report, export."""

from __future__ import annotations

import json

from ._collectives import LocalCollectives, MpiCollectives
from ._trainer import Trainer


def run(cfg, comm=None, log=print) -> dict:
    """Train per ``cfg``; under MPI pass the job's communicator. Returns the metrics dict (rank 0)."""
    coll = MpiCollectives(comm, cfg.train.ranks_per_node) if comm is not None and comm.Get_size() > 1 \
        else LocalCollectives()
    say = log if coll.rank == 0 else (lambda *a, **k: None)
    trainer = Trainer(cfg, coll, log=say)
    try:
        bayes = trainer.dataset.bayes_auc() if hasattr(trainer.dataset, "bayes_auc") else None
        say(f"hps: training {cfg.data.format} data on {cfg.tiers.device}, {coll.size} rank(s), "
            f"batch {cfg.train.batch_size}, mini-batch {cfg.train.minibatch_size}, "
            f"MEM-PS cache {trainer.memps.cache.capacity_rows:,} rows, SSD-PS {trainer.ssd_dir}")
        metrics = trainer.fit()
        metrics.update(trainer.evaluate())
        if bayes is not None:
            metrics["bayes_auc"] = bayes
        metrics["bytes_sent"] = coll.bytes_sent()
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
        per_ex = ", ".join(f"{k} {v:.0f}" for k, v in m["bytes_sent_per_example"].items())
        lines.append(f"communication {m['comm_seconds']:.1f} s; bytes sent per example (rank 0): {per_ex}")
    return "\n".join(lines)
