"""``--plots DIR``: the run's figures as PNG (matplotlib, the optional ``plots`` extra), each titled
with the run's name (``run_name`` of the metrics: model, format, data, start time).

- ``stage_seconds.png``: busy and waiting seconds of each pipeline stage (the paper's Figure 3c);
- ``cache_hit_rate.png``: MEM-PS hit rate of every batch (Figure 4c);
- ``loss.png``: training loss of every batch.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidInputError


def require():
    """``matplotlib.pyplot`` on the Agg backend; InvalidInputError when matplotlib cannot be imported
    (a job with ``--plots`` calls this before it trains)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise InvalidInputError(f"--plots needs matplotlib ({e}): pip install 'hps[plots]'") from None
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

    for key, name, label in (("cache_hit_rate_per_batch", "cache_hit_rate.png", "MEM-PS hit rate"),
                             ("loss_per_batch", "loss.png", "training loss")):
        series = metrics.get(key) or []
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(range(len(series)), series)
        ax.set_xlabel("batch")
        ax.set_ylabel(label)
        ax.set_title(f"{label} per batch")
        save(fig, name)
    return paths
