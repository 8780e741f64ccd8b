"""Memory budgets for tests whose MEM-PS must spill to the SSD-PS.

``--mem-budget`` is a job's host memory as a whole (``hps.train._budget``): a test that wants the
MEM-PS to hold about N rows asks the job's own plan for the budget that leaves it that much,
instead of writing a size that the other shares of the plan would change under it."""

from __future__ import annotations

import re


def spill_budget(job, cache_rows: int, table_keys: int | None = None) -> int:
    """The --mem-budget of the one-process job ``job`` (CLI flags, or a flat dict of options; no
    budget) whose MEM-PS caches about ``cache_rows`` rows beside the SSD-PS key index of a table of
    ``table_keys`` (default 10 x ``cache_rows``)."""
    from hps.config import Config
    from hps.train._cli import parse_config
    from hps.train._trainer import Trainer

    cfg = Config.from_flat(job) if isinstance(job, dict) else parse_config([str(a) for a in job])
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    try:
        keys = 10 * int(cache_rows) if table_keys is None else int(table_keys)
        return trainer.plan.budget_for_cache_rows(int(cache_rows), keys)
    finally:
        trainer.close()


def smallest_budget(run, margin: float = 0.02) -> int:
    """The smallest --mem-budget every rank of a job accepts, plus ``margin``: ``run(budget)`` starts
    the job (one process or under mpiexec) and returns its CompletedProcess; a budget of 1 MiB is
    refused by each rank with the budget it needs ("raise --mem-budget to at least N B")."""
    proc = run(1 << 20)
    needs = [int(n) for n in re.findall(r"raise --mem-budget to at least (\d+) B", proc.stderr)]
    assert proc.returncode != 0 and needs, proc.stderr[-3000:]
    return int(max(needs) * (1 + margin))
