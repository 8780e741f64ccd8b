"""``--plots DIR``: the run's figures as PNG (matplotlib, the optional ``plots`` extra), each titled
with the run's name (``run_name`` of the metrics: model, format, data, start time).

- ``stage_seconds.png``: busy and waiting seconds of each pipeline stage (the paper's Figure 3c);
- ``cache_hit_rate.png``: MEM-PS hit rate of every batch (Figure 4c);
- ``loss.png``: training loss of every batch and, with ``--eval-every``, the eval curve beside it,
  titled with the run's name (``run_name`` in the metrics).
"""

from __future__ import annotations

from pathlib import Path

from .._extras import install_hint
from ..errors import InvalidInputError


def require():
    """``matplotlib.pyplot`` on the Agg backend; InvalidInputError when matplotlib cannot be imported
    (a job with ``--plots`` calls this before it trains)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise InvalidInputError(f"--plots needs matplotlib ({e}): {install_hint('plots')}") from None
    return plt


def draw(metrics: dict, directory) -> list[str]:
    """Write the figures of ``metrics`` (as returned by ``hps.train.run``) -> their paths."""
    plt = require()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    def save(fig, name):
        path = out / name
        if metrics.get("run_name"):
            fig.suptitle(metrics["run_name"], fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(str(path))

    stages = list(metrics["stage_seconds"])
    busy = [metrics["stage_seconds"][s] for s in stages]
    wait = [metrics.get("stage_wait_seconds", {}).get(s, 0.0) for s in stages]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(stages, busy, label="busy")
    ax.bar(stages, wait, bottom=busy, label="waiting", alpha=0.5)
    ax.set_ylabel("seconds")
    ax.set_title(f"pipeline stages (bottleneck: {metrics.get('bottleneck', '?')})")
    ax.legend()
    save(fig, "stage_seconds.png")

    series = metrics.get("cache_hit_rate_per_batch") or []
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(len(series)), series)
    ax.set_xlabel("batch")
    ax.set_ylabel("MEM-PS hit rate")
    ax.set_title("MEM-PS hit rate per batch")
    save(fig, "cache_hit_rate.png")
    save(_loss_and_eval(plt, metrics), "loss.png")
    return paths


def _loss_and_eval(plt, metrics: dict):
    """The training loss per batch and, beside it, the eval curve (``--eval-every``: AUC and logloss
    at each evaluation, the best marked), under the run's name."""
    curve = metrics.get("eval_curve") or []
    fig, axes = plt.subplots(1, 2 if curve else 1, figsize=(11 if curve else 6, 3.8), squeeze=False)
    loss = metrics.get("loss_per_batch") or []
    ax = axes[0, 0]
    ax.plot(range(len(loss)), loss, label="training loss")
    for c in curve:  # the eval logloss on the same axes, at the batch it was taken after
        ax.plot(c["batch"], c["logloss"], "o", color="C1", label="eval logloss" if c is curve[0] else None)
    ax.set_xlabel("batch")
    ax.set_ylabel("logloss")
    ax.set_title("training loss per batch")
    ax.legend()
    if curve:
        ax = axes[0, 1]
        ax.plot([c["batch"] for c in curve], [c["auc"] for c in curve], "o-", color="C2")
        best = metrics.get("best_eval")
        if best:
            ax.plot(best["batch"], best["auc"], "*", markersize=14, color="C3",
                    label=f"best {best['auc']:.4f}")
            ax.legend()
        stop = metrics.get("early_stopped_after_batch")
        if stop is not None:
            ax.axvline(stop, color="grey", linestyle="--")
        ax.set_xlabel("batch")
        ax.set_ylabel("eval AUC")
        ax.set_title("eval AUC during training" + (f" (early stop after batch {stop})" if stop is not None else ""))
    return fig  # titled with the run name by draw()'s save()
