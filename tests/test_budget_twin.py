"""The default ``--hbm-budget`` on ``--device cpu`` is the twin's share of the host budget (issue #24):
the largest twin whose last growth takes no more than ``TWIN_SHARE`` of what the MEM-PS tier can
spare beyond one batch's working set and the SSD-PS index, never below ``2 x (window + 1)`` working
sets; a small budget gives a small twin, and a budget below the working set is still refused."""

from dataclasses import replace

import numpy as np
import pytest

from hps.errors import InvalidInputError
from hps.train import main
from hps.train._budget import TwinBudget, plan_memory, tier_floor
from hps.train._hbm_budget import (TWIN_SHARE, hbm_budget_for, hbm_bytes, hbm_rows_for, twin_growth_bytes,
                                   working_set_budget_rows)

MODEL, PIPE, WIDTH = {"dense": 3 << 20}, 1 << 20, 32


def plan(budget, owned=1000, ws=1500, **kw):
    return plan_memory(budget, WIDTH, owned, ws, window=3, device="cpu", model=MODEL, pipeline=PIPE, **kw)


def room(p):
    """What the tier can spare beyond its floor, from the plan's own shares (the twin's first size is
    part of its share: it is counted back)."""
    fixed = sum(s.nbytes for s in p.shares if s.what != "HBM-PS twin")
    return p.budget - fixed - tier_floor(p.working_set, p.budget, WIDTH, p.rows_per_file)


@pytest.mark.parametrize("budget", [256 << 20, 1 << 30, 8 << 30])
def test_the_default_is_the_twins_share_of_the_budget(budget):
    """The twin may grow to the largest table whose last doubling fits TWIN_SHARE of the room, no larger:
    at 1 GiB 524,288 rows (5933de0: 16,384, the working sets alone, whatever the budget)."""
    p = plan(budget)
    share = TWIN_SHARE * room(p)
    rows = p.hbm_rows
    assert rows > working_set_budget_rows(1500, 3)
    assert twin_growth_bytes(rows // 2, rows, WIDTH, 4, 1) <= share < twin_growth_bytes(rows, 2 * rows, WIDTH, 4, 1)
    assert p.hbm_budget == hbm_budget_for(rows, WIDTH) and hbm_rows_for(p.hbm_budget, WIDTH, 4) == rows
    assert p.hbm_keys == 16_384 and p.hbm_tracks   # it starts at the first batch's size, and its floor tracks
    assert p.twin_growth == hbm_bytes(rows, WIDTH, 4, 1) - p.share("HBM-PS twin")
    line = p.describe()
    assert "(default: the twin's share, 0.5 of the" in line and "the MEM-PS tier can spare" in line, line
    assert "comes out of the MEM-PS tier" in line
    if budget == 1 << 30:
        assert rows == 524_288


def test_a_small_budget_gives_a_small_twin_down_to_the_working_sets():
    rows = [plan(b).hbm_rows for b in (12 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, 8 << 30)]
    assert rows == sorted(rows) and rows[0] < rows[-1]
    floor = working_set_budget_rows(1500, 3)
    small = plan(16 << 20)
    assert small.hbm_rows == floor and small.twin_growth == 0
    assert "(default: 2 x (window + 1) working sets of the largest batch so far (more than the twin's share" \
        in small.describe()
    # given, --hbm-budget is what it says, whatever the budget
    assert plan(8 << 30, hbm_budget=1 << 20).hbm_budget == 1 << 20 and not plan(8 << 30, hbm_budget=1 << 20).hbm_tracks


def test_the_simulator_gets_the_cpu_default():
    """Under the CUDA simulator (free memory unbounded) the default is the CPU's: the cpu and cuda jobs
    hold and evict the same rows."""
    for b in (16 << 20, 1 << 30):
        cpu = plan(b)
        sim = plan_memory(b, WIDTH, 1000, 1500, window=3, device="cuda", model=MODEL, pipeline=PIPE,
                          free_bytes=float("inf"))
        assert (sim.hbm_budget, sim.hbm_rows, sim.hbm_tracks, sim.hbm_source) == \
               (cpu.hbm_budget, cpu.hbm_rows, cpu.hbm_tracks, cpu.hbm_source)


def test_the_refusal_still_triggers_and_the_budget_it_names_leaves_the_tier_its_floor():
    with pytest.raises(InvalidInputError, match="raise --mem-budget to at least") as ei:
        plan(8 << 20, owned=20_000, ws=20_000)
    for needle in ("model", "HBM-PS twin", "batches in flight", "SSD-PS buffers", "MEM-PS"):
        assert needle in str(ei.value)
    need = int(str(ei.value).split("at least ")[1].split(" B")[0])
    for b in (need, need + (1 << 20), 4 * need, 64 * need):
        p = plan(b, owned=20_000, ws=20_000)
        memps = _Budgeted(p.tier_bytes)
        grow = TwinBudget(p, memps, 1)
        cap = p.hbm_keys
        while cap < p.hbm_rows:   # the twin grows by doubling to its budget, as ParameterHierarchy._grow
            cap = min(2 * cap, p.hbm_rows)
            grow(cap, lambda c: None)
        # at every step, and with the twin at its largest, the MEM-PS keeps what the refusal asks of its
        # tier: one batch's rows beside the SSD-PS index of their table
        least = replace(p, tier_bytes=min(memps.budgets, default=p.tier_bytes))
        assert least.cache_rows >= 20_000 and least.max_table_keys >= 20_000, (b, least.tier_bytes)
        assert (p.twin_growth > 0) == (b == 64 * need), (b, p.twin_growth)   # the working sets' floor below


class _Budgeted:
    """The MEM-PS side of TwinBudget: the budgets it is given."""

    def __init__(self, tier):
        self.budgets = []

    def set_budget(self, b):
        self.budgets.append(b)


JOB = ["--rows", "20000", "--fields", "4", "--vocab-per-field", "50000", "--batch-size", "512",
       "--minibatch-size", "128", "--hidden", "8", "--embedding-dim", "8", "--no-progress"]


def test_a_job_whose_table_fits_the_twins_share_evicts_nothing(tmp_path, capsys):
    """The default holds this 19 k-key table (5933de0's default held 2 x (window + 1) working sets,
    16,384 rows, and evicted 2,939 rows to the MEM-PS and fetched them back); a small budget's twin
    evicts, and both train the same model."""
    import json

    from hps.train import load_export

    def run(name, *extra):
        out, m = tmp_path / name, tmp_path / f"{name}.json"
        assert main([*JOB, "--export", str(out), "--metrics-out", str(m), *extra]) == 0
        return load_export(out), json.loads(m.read_text())

    (kb, vb, db), mb = run("big", "--mem-budget", "256MB")
    assert "(default: the twin's share" in capsys.readouterr().out
    assert mb["hbm_evicted_rows"] == 0 and max(mb["resident_rows"]) == mb["table_rows"] > 16_384
    (ks, vs, ds), ms = run("small", "--mem-budget", "256MB", "--hbm-budget", "1MB")
    assert ms["hbm_evicted_rows"] > 0
    ob, os_ = np.argsort(kb), np.argsort(ks)
    np.testing.assert_array_equal(kb[ob], ks[os_])
    assert np.abs(vb[ob] - vs[os_]).max() <= 1e-5
    for name in db:
        assert np.abs(db[name] - ds[name]).max() <= 1e-5
