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
    from hps.cli import parse_config
    from hps.train._trainer import Trainer

    cfg = Config.from_flat(job) if isinstance(job, dict) else parse_config([str(a) for a in job])
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    try:
        keys = 10 * int(cache_rows) if table_keys is None else int(table_keys)
        return trainer.plan.budget_for_cache_rows(int(cache_rows), keys)
    finally:
        trainer.close()


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def smallest_budget(run, margin: int = 4096) -> tuple[int, int]:
    """The smallest --mem-budget every rank of a job accepts, plus ``margin`` bytes, and the MEM-PS
    tier it leaves (the cache of one batch's working set beside the SSD-PS index of their table):
    ``run(budget)`` starts the job (one process or under mpiexec) and returns its CompletedProcess; a
    budget too small is refused by each rank with the budget it needs ("... (N KiB with their maps
    and ghost table) beside the SSD-PS key index of their table (N KiB); raise --mem-budget to at
    least N B")."""
    budget = 1 << 20
    size = r"\(([0-9.]+) (B|KiB|MiB|GiB)"
    for _ in range(8):   # a budget below the model's share is refused before the plan: try larger
        proc = run(budget)
        needs = re.findall(size + r" with their maps and ghost table\) beside the SSD-PS key index of their "
                           r"table " + size + r"\); raise --mem-budget to at least (\d+) B", proc.stderr)
        if needs:
            cache, cu, index, iu, need = max(needs, key=lambda n: int(n[4]))
            return int(need) + margin, int(float(cache) * _UNITS[cu] + float(index) * _UNITS[iu]) + margin
        assert proc.returncode != 0 and "its memory budget is" in proc.stderr, proc.stderr[-3000:]
        budget *= 4
    raise AssertionError(proc.stderr[-3000:])


def smallest_spill_budget(run, table_keys: int, row_bytes: int, rows_per_file: int = 16_384) -> int:
    """A --mem-budget for every rank of a job (one process or MPI) whose MEM-PS tier holds one
    batch's working set, or, when larger, the SSD-PS index of ``table_keys`` (a rank's share of the
    table; written a compaction batch at a time) at its largest with a chunk on its way. The cache
    has the index's room while the table is small, and gives it back as the index grows: it holds
    fewer rows than the table (rows spill) and the job ends (``run(budget)``: as for
    :func:`smallest_budget`)."""
    from hps.train._budget import compaction_rows, index_bytes_for

    budget, tier = smallest_budget(run)
    merge = compaction_rows(budget, row_bytes, rows_per_file)
    # the MEM-PS keeps 1/16 for a chunk on its way, and 1/64 of slack on its capacity
    index = index_bytes_for(int(table_keys) + merge, int(row_bytes)) * 8 // 7 + (64 << 10)
    return budget + max(0, index - tier)


#: The value of --mem-budget in a test's flags that :func:`resolve_spill` replaces.
SPILL = "spill-budget"


def resolve_spill(argv, run, table_keys: int, row_bytes: int = 64) -> list:
    """``argv`` with ``--mem-budget SPILL`` made :func:`smallest_spill_budget` of the job ``run(argv)``
    (its CompletedProcess) for a rank's ``table_keys``; ``argv`` itself without the placeholder."""
    argv = [str(a) for a in argv]
    if SPILL not in argv:
        return argv

    def sub(budget):
        return [str(budget) if a == SPILL else a for a in argv]

    rows_per_file = int(argv[argv.index("--rows-per-file") + 1]) if "--rows-per-file" in argv else 16_384
    return sub(smallest_spill_budget(lambda b: run(sub(b)), table_keys, row_bytes, rows_per_file))


def train_with_cache_rows(argv, cache_rows: int, export) -> dict:
    """Train the one-process job of CLI flags ``argv`` with a MEM-PS cache of ``cache_rows`` rows (a
    row count, not a byte budget: on a small table a budget's cache borrows the room of the SSD-PS
    index and may hold the whole table), export it to ``export`` (an ``--export`` job: its metrics count
    the end's write-back) and evaluate -> its metrics."""
    from hps.cli import parse_config
    from hps.train._trainer import Trainer

    cfg = parse_config([*(str(a) for a in argv), "--export", str(export)])
    t = Trainer(cfg, log=lambda *a, **k: None, cache_rows=int(cache_rows))
    try:
        m = t.fit()
        t.export(str(export))
        m.update(t.evaluate())
    finally:
        t.close()
    return m
