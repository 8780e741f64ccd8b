"""--mem-budget bounds the process: the MEM-PS cache with its maps and ghost table and the SSD-PS
buffers fit in it, the rest is printed at start, and a budget below one batch's working set is a
clear error before training starts."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from hps.config import parse_bytes
from hps.errors import InvalidInputError
from hps.mem import RowCache
from hps.ssd import SSDOptions, SSDStore
from hps.train._budget import (DEFAULT_BUDGET_FRACTION, HBM_CACHE, Share, budget_for_rows, plan_memory,
                               resolve_budget)

SMALL = ["--rows", "6000", "--fields", "4", "--vocab-per-field", "3000", "--batch-size", "1024",
         "--minibatch-size", "256", "--hidden", "8", "--embedding-dim", "8", "--no-progress"]


@pytest.mark.parametrize("cap, width, ghost", [(1, 1, 4.0), (1000, 32, 4.0), (12345, 7, 0.0), (777, 384, 1.5)])
def test_cache_bytes_are_exact_and_the_largest_fit_is_found(cap, width, ghost):
    c = RowCache(cap, width, ghost_factor=ghost)
    assert c.nbytes <= RowCache.bytes_for(cap, width, np.float32, ghost)
    c.put(np.arange(cap, dtype=np.uint64), np.zeros((cap, width), np.float32))   # full: at its capacity
    assert RowCache.bytes_for(cap, width, np.float32, ghost) == c.nbytes
    assert RowCache.rows_for_bytes(c.nbytes, width, np.float32, ghost) == cap
    assert RowCache.rows_for_bytes(c.nbytes - 1, width, np.float32, ghost) < cap


MODEL = {"dense": 3 << 20}


@pytest.mark.parametrize("budget", [16 << 20, 64 << 20, 8 << 30])
def test_plan_divides_the_whole_budget(budget):
    """Model, twin, batches in flight, SSD-PS buffers and the MEM-PS tier add up to the budget; the
    tier caches at least the working set; cuda has no twin; the line names every share."""
    p = plan_memory(budget, 32, 1000, 1500, window=3, device="cpu", model=MODEL, pipeline=1 << 20,
                    source="--mem-budget")
    assert sum(s.nbytes for s in p.shares) + p.tier_bytes == budget
    assert p.share("model") == 3 << 20 and p.share("batches in flight") == 1 << 20
    # the twin starts as the slot array of 2 (window + 1) working sets (12,000 keys: 32,768 slots at
    # load 0.5), all of it; the default --hbm-budget on cpu lets it grow to its share of the budget, at
    # least that table (tests/test_budget_twin.py)
    assert p.hbm_keys == 16_384 <= p.hbm_rows and p.share("HBM-PS twin") > 16_384 * 128
    assert (p.hbm_rows == 16_384) == (budget == 16 << 20)   # 16 MiB: no room beyond the working sets
    assert p.tier_bytes >= RowCache.bytes_for(1000, 32) and p.cache_rows >= 1000 and p.device == ()
    gpu = plan_memory(budget, 32, 1000, 1500, window=3, device="cuda", model=MODEL, pipeline=1 << 20,
                      hbm_budget=1 << 30, free_bytes=float(80 << 30))
    assert gpu.share("HBM-PS twin") == 0 and gpu.tier_bytes > p.tier_bytes
    assert gpu.device == (Share(HBM_CACHE, 1 << 30),) and gpu.hbm_keys == 16_384 < gpu.hbm_rows
    free = plan_memory(budget, 32, 1000, 1500, window=3, device="cuda", model=MODEL, pipeline=1 << 20,
                       free_bytes=float(80 << 30))
    assert free.hbm_budget == 40 << 30 and "0.5 of the GPU's free 80.0 GiB" in free.describe()
    line = p.describe()
    for needle in ("(--mem-budget)", "model 3.0 MiB", "HBM-PS twin", "batches in flight 1.0 MiB", "SSD-PS buffers",
                   "MEM-PS tier", "SSD-PS key index"):
        assert needle in line, (needle, line)
    SSDOptions(**p.ssd_options())      # valid SSD-PS options


@pytest.mark.parametrize("rows, width", [(1, 16), (1000, 32), (40_000, 32), (300_000, 384)])
def test_budget_for_cache_rows_is_the_smallest_that_caches_them(rows, width):
    def plan(budget):
        return plan_memory(budget, width, rows, rows, window=3, device="cpu", model=MODEL, pipeline=1 << 20)

    def fits(budget):   # the tier holds the rows, the SSD-PS index of the table and 1/16 for rows on their way to it
        try:
            q = plan(budget)
        except InvalidInputError:   # not even the working set's table
            return False
        return q.tier_bytes * 15 // 16 >= RowCache.bytes_for(rows, width) + q.index_bytes(10 * rows)

    b = plan(1 << 40).budget_for_cache_rows(rows, 10 * rows)
    assert fits(b) and plan(b).max_table_keys >= 10 * rows
    assert not fits(b - 4096)
    assert budget_for_rows(rows, width) < b   # the MEM-PS tier alone


def test_a_budget_for_fewer_rows_than_the_working_set_holds_the_table():
    """A budget asked for a cache below one batch's working set still holds the table it was asked
    for: the tier caches the working set beside the table's index at its end (the spilling tests'
    budgets for 10 % of a table of 18,281 keys left a table of 15,872, and the job stopped)."""
    def plan(budget, ws):
        return plan_memory(budget, 64, ws, ws, window=3, device="cpu", model=MODEL, pipeline=1 << 20,
                           rows_per_file=512)

    short = []
    for table in range(14_000, 20_000, 250):
        ws = table // 10 + 200
        b = plan(1 << 40, ws).budget_for_cache_rows(table // 10, table)
        if plan(b, ws).max_table_keys < table:
            short.append(table)
    assert not short


def test_plan_refuses_a_budget_below_the_working_set_and_names_the_shares_and_one_that_works():
    with pytest.raises(InvalidInputError, match="raise --mem-budget to at least") as ei:
        plan_memory(4 << 20, 32, 10_000, 10_000, window=3, device="cpu", model=MODEL, pipeline=1 << 20)
    msg = str(ei.value)
    assert "model 3.0 MiB" in msg and "HBM-PS twin" in msg and "batches in flight 1.0 MiB" in msg
    enough = int(re.search(r"at least (\d+) B", msg).group(1))
    p = plan_memory(enough, 32, 10_000, 10_000, window=3, device="cpu", model=MODEL, pipeline=1 << 20)
    assert p.cache_rows >= 10_000 and p.max_table_keys >= 10_000


def test_the_budget_a_refusal_names_trains_its_job(tmp_path):
    """The budget the refusal names is one the job runs with: the MEM-PS caches the batch's rows beside
    the SSD-PS index of their table, which it keeps room for from its start (the refusal named the
    cache alone: a job given that budget stopped at its start, "raise the budget by at least 24,931 B",
    and the printed plan said "a table of up to 0 keys"). One batch: the whole table is its working set."""
    job = ["--rows", "500", "--fields", "4", "--vocab-per-field", "1000", "--batch-size", "500",
           "--minibatch-size", "100", "--hidden", "4", "--embedding-dim", "8", "--no-progress"]
    bad, _ = hps_train(tmp_path, *job, "--mem-budget", "3MB")
    one_line_error(bad, "cannot hold one batch's working set", "SSD-PS key index", "raise --mem-budget to at least")
    enough = int(re.search(r"at least (\d+) B", bad.stderr).group(1))
    ok, _ = hps_train(tmp_path, *job, "--mem-budget", enough)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "a table of up to 0 keys" not in ok.stdout
    short, _ = hps_train(tmp_path, *job, "--mem-budget", enough - 1024)
    one_line_error(short, "cannot hold one batch's working set")


# --- the budget without --mem-budget, and checks against the machine -------------------------------
def _machine(tmp_path, monkeypatch, meminfo_kb=None, v2=None, v1=None, total=None):
    """Point hps.train._machine at fixture files: /proc/meminfo, a cgroup v2 memory.max and a cgroup
    v1 memory.limit_in_bytes (with their usage) in this process's cgroup, and physical memory."""
    from hps.train import _machine

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "meminfo").write_text("MemTotal: 99 kB\n" + (f"MemAvailable: {meminfo_kb} kB\n" if meminfo_kb else ""))
    (tmp_path / "cgroup").write_text("9:memory:/job\n0::/job\n")
    for root, (limit_f, usage_f), val in ((tmp_path / "v2", ("memory.max", "memory.current"), v2),
                                          (tmp_path / "v1", ("memory.limit_in_bytes", "memory.usage_in_bytes"), v1)):
        (root / "job").mkdir(parents=True)
        if val is not None:
            (root / "job" / limit_f).write_text(f"{val[0]}\n")
            (root / "job" / usage_f).write_text(f"{val[1]}\n")
    monkeypatch.setattr(_machine, "PROC_MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(_machine, "PROC_CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(_machine, "CGROUP_V2_ROOT", tmp_path / "v2")
    monkeypatch.setattr(_machine, "CGROUP_V1_ROOT", tmp_path / "v1")
    if total is not None:
        monkeypatch.setattr(_machine.os, "sysconf", lambda name: {"SC_PHYS_PAGES": total // 4096,
                                                                 "SC_PAGE_SIZE": 4096}[name])


def test_default_budget_is_a_share_of_the_memory_available(tmp_path, monkeypatch):
    """Without --mem-budget: DEFAULT_BUDGET_FRACTION of MemAvailable over the ranks on the node, or of
    the cgroup's limit less its usage when lower (v2 memory.max, v1 memory.limit_in_bytes), printed
    with where it came from; an explicit budget is used as given."""
    gib = 1 << 30
    _machine(tmp_path, monkeypatch, meminfo_kb=24 * gib // 1024)
    assert resolve_budget(None, 1) == (int(DEFAULT_BUDGET_FRACTION * 24 * gib),
                                       f"{DEFAULT_BUDGET_FRACTION} x MemAvailable 24.0 GiB / 1 rank on this node")
    assert resolve_budget(None, 4)[0] == int(DEFAULT_BUDGET_FRACTION * 24 * gib / 4)
    assert resolve_budget(3 * gib, 4) == (3 * gib, "--mem-budget")
    monkeypatch.undo()
    _machine(tmp_path / "b", monkeypatch, meminfo_kb=24 * gib // 1024, v2=(8 * gib, 2 * gib))
    budget, source = resolve_budget(None, 2)
    assert budget == int(DEFAULT_BUDGET_FRACTION * 6 * gib / 2) and "cgroup memory.max less its usage 6.0 GiB" in source
    monkeypatch.undo()
    _machine(tmp_path / "c", monkeypatch, meminfo_kb=24 * gib // 1024, v1=(4 * gib, gib))
    assert resolve_budget(None, 1)[0] == int(DEFAULT_BUDGET_FRACTION * 3 * gib)
    monkeypatch.undo()
    _machine(tmp_path / "d", monkeypatch, v1=(1 << 63, 0))   # v1's "no limit", and no MemAvailable
    with pytest.raises(InvalidInputError, match="give --mem-budget"):
        resolve_budget(None, 1)


def test_a_budget_beyond_the_machine_is_refused_before_anything_is_allocated(tmp_path, monkeypatch):
    gib = 1 << 30
    _machine(tmp_path, monkeypatch, meminfo_kb=gib // 1024, total=16 * gib)
    assert resolve_budget(16 * gib, 1)[0] == 16 * gib
    with pytest.raises(InvalidInputError, match=r"--mem-budget 16.0 GiB x 2 ranks on this node is more than this "
                                                r"machine's memory, 16.0 GiB \(physical memory\)"):
        resolve_budget(16 * gib, 2)
    monkeypatch.undo()
    _machine(tmp_path / "b", monkeypatch, meminfo_kb=gib // 1024, v2=(2 * gib, 0), total=16 * gib)
    with pytest.raises(InvalidInputError, match="2.0 GiB \\(cgroup memory.max\\)"):
        resolve_budget(3 * gib, 1)


def test_read_buffer_stays_within_its_option(tmp_path):
    """A load of every row of 64 MiB of files never holds more than read_buffer_bytes of them
    (format 1 read whole files into a buffer as large as the largest file)."""
    opts = SSDOptions(background=False, io_threads=2, max_read_bytes=32 << 10, read_buffer_bytes=64 << 10)
    with SSDStore(tmp_path / "s", 64, rows_per_file=1 << 16, options=opts) as s:
        k = np.arange(1 << 16, dtype=np.uint64)
        rows = np.random.default_rng(0).standard_normal((1 << 16, 64)).astype(np.float32)
        s.dump(k, rows)
        got, found = s.load(k)
        assert found.all()
        np.testing.assert_array_equal(got, rows)
        assert s._io._buffer(0).shape[0] <= 64 << 10


def hps_train(tmp_path, *args, timeout=600):
    """Run ``python -m hps.train`` -> (CompletedProcess, its peak RSS in bytes). The peak is read by
    a wrapper process whose only child is the job (RUSAGE_CHILDREN of pytest's own process would
    hold every earlier test's children too)."""
    wrap = ("import json, resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "print(json.dumps([p.returncode, p.stdout, p.stderr, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")
    out = subprocess.run([sys.executable, "-c", wrap, sys.executable, "-m", "hps.train", "--no-progress",
                          *map(str, args)], capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    code, stdout, stderr, kib = json.loads(out.stdout)
    return subprocess.CompletedProcess(args, code, stdout, stderr), kib * 1024


def one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    assert "hps: training" not in proc.stdout


def test_cli_prints_the_plan_and_refuses_a_small_budget_before_training(tmp_path):
    ok, _ = hps_train(tmp_path, *SMALL, "--mem-budget", "16MB")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "hps: budget 16.0 MiB (--mem-budget): model" in ok.stdout and "HBM-PS twin" in ok.stdout
    bad, _ = hps_train(tmp_path, *SMALL, "--mem-budget", "1MB")
    one_line_error(bad, "cannot hold one batch's working set", "HBM-PS twin", "raise --mem-budget to at least")


#: Jobs small enough for CI whose peak RSS is checked against their budget: a table of 32-B rows
#: whose SSD-PS key index outweighs it (the index was outside the budget: 604 MiB at 140 MiB, empty
#: job 355 MiB), and one that spills to the SSD-PS and reads it back.
RSS_JOBS = {
    "index-heavy": (["--fields", "8", "--vocab-per-field", "200000", "--zipf", "0.5", "--batch-size", "4096",
                     "--minibatch-size", "1024", "--embedding-dim", "4", "--hidden", "8", "--rows", "60000"], "140MB"),
    "spilling": (["--fields", "8", "--vocab-per-field", "50000", "--batch-size", "2048", "--minibatch-size", "512",
                  "--embedding-dim", "16", "--hidden", "16", "--rows", "80000", "--hbm-budget", "4MiB"], "36MB"),
}


@pytest.mark.parametrize("job", sorted(RSS_JOBS))
def test_peak_rss_stays_within_the_budget(tmp_path, job):
    """--mem-budget bounds the job as a whole: its peak RSS is at most the budget plus what the same
    command holds on 64 examples (an empty job: interpreter, libraries, compiled kernels), + 5 %
    (the target: allocator slack and the interpreter's own growth, which no plan counts). Both are
    measured with Numba's cache warm (a first run of the job fills it): compiling a kernel takes
    LLVM's memory once (on a cold cache the empty job peaked at 318 MiB against 228 warm, the
    spilling job at 291 against 284), which is neither the budget's nor an empty job's to hold.
    The peaks are the child's own (ru_maxrss): other processes on the machine do not move them."""
    args, budget = RSS_JOBS[job]
    metrics = tmp_path / "m.json"
    warm, _ = hps_train(tmp_path, *args, "--mem-budget", budget)
    assert warm.returncode == 0, warm.stderr[-2000:]
    empty, base = hps_train(tmp_path, *args, "--rows", "64", "--mem-budget", "8MB")
    assert empty.returncode == 0, empty.stderr[-2000:]
    run, peak = hps_train(tmp_path, *args, "--mem-budget", budget, "--metrics-out", metrics)
    assert run.returncode == 0, run.stderr[-2000:]
    m = json.loads(metrics.read_text())
    limit = 1.05 * (parse_bytes(budget) + base)
    assert peak <= limit, f"peak {peak / 2**20:.0f} MiB > {limit / 2**20:.0f} MiB (empty job {base / 2**20:.0f} MiB)"
    assert m["table_rows"] > 250_000 if job == "index-heavy" else m["ssd_rows_loaded"] > 10_000


def test_memory_follows_the_data_not_the_budget(tmp_path):
    """A 4 GiB budget over a small table holds what 256 MiB does (it allocated the whole cache up
    front: 2.0 GB against 0.39 GB); a budget beyond the machine is one line, before any allocation."""
    _, small = hps_train(tmp_path, *SMALL, "--mem-budget", "256MiB")
    run, big = hps_train(tmp_path, *SMALL, "--mem-budget", "4GiB")
    assert run.returncode == 0, run.stderr[-2000:]
    assert big < small + (32 << 20), (small / 2**20, big / 2**20)
    proc, _ = hps_train(tmp_path, *SMALL, "--mem-budget", "1000TB")
    one_line_error(proc, "--mem-budget 1000.0 TiB is more than this machine's memory")


def test_a_batch_size_beyond_the_budget_is_one_line(tmp_path):
    proc, _ = hps_train(tmp_path, *SMALL, "--batch-size", str(10**12), "--minibatch-size", "1024")
    one_line_error(proc, "--batch-size 1,000,000,000,000", "more than the memory budget", "lower --batch-size")


def test_default_budget_keeps_a_table_that_fits_in_memory(tmp_path):
    """Without --mem-budget a job whose table fits the machine reads nothing back from the SSD-PS (a
    fixed 256 MiB default spilled this 280 k-row table of 1 KiB rows); the plan says where the
    budget came from."""
    metrics = tmp_path / "m.json"
    run, _ = hps_train(tmp_path, "--fields", "4", "--vocab-per-field", "100000", "--zipf", "0.01", "--rows", "120000",
                       "--batch-size", "4096", "--minibatch-size", "1024", "--embedding-dim", "128", "--hidden", "16",
                       "--metrics-out", metrics)
    assert run.returncode == 0, run.stderr[-2000:]
    m = json.loads(metrics.read_text())
    assert m["table_rows"] > 250_000 and m["ssd_rows_loaded"] == 0 and m["ssd_bytes_read"] == 0
    assert re.search(r"hps: budget [0-9.]+ GiB \(0.5 x (MemAvailable|cgroup [a-z_.]+)", run.stdout), run.stdout[:2000]


def test_ssd_page_cache_flag_names_the_store_policies():
    from hps.config import PAGE_CACHE_MODES, TierConfig
    from hps.ssd._fileio import PAGE_CACHE_MODES as STORE_MODES

    assert PAGE_CACHE_MODES == STORE_MODES and TierConfig().ssd_page_cache == SSDOptions().page_cache
    with pytest.raises(InvalidInputError, match="ssd-page-cache"):
        TierConfig(ssd_page_cache="sometimes")


def test_a_growing_hbm_twin_is_charged_to_the_mem_ps(tmp_path):
    """An HBM-PS twin that outgrows its planned share (here: planned at 1,024 keys) takes what it
    grows by from the MEM-PS tier, whose cache gives way: the plan's total still holds."""
    from hps.train import Trainer
    from hps.cli import parse_config

    t = Trainer(parse_config([*SMALL, "--hbm-capacity", "1024", "--mem-budget", "64MB",
                              "--ssd-path", str(tmp_path / "ssd")]), log=lambda *a, **k: None)
    try:
        t.fit(warm_up=False)
        grown = t.hier.hbm.capacity
        twin = t.hier.hbm._impl
        table = twin.tkeys.nbytes + twin.tstate.nbytes + twin.tvals.nbytes
        planned = t.hier.grow._table(1024)
        assert grown > 1024 and table > planned
        assert t.memps.budget_bytes == t.plan.tier_bytes - (t.hier.grow._table(grown) - planned)
        assert t.memps.cache.nbytes + t.store.index_bytes() <= t.memps.budget_bytes
    finally:
        t.close()


@pytest.mark.parametrize("budget, width, working_set, rows_per_file", [
    (8 << 20, 8, 1000, 16_384), (32 << 20, 8, 4000, 16_384), (16 << 20, 32, 2000, 16_384),
    (64 << 20, 4, 20_000, 256)])
def test_a_table_up_to_the_plans_limit_fits_its_mem_ps(tmp_path, budget, width, working_set, rows_per_file):
    """The plan's promise (``max_table_keys``: a larger table stops the job) is kept by a MemPS of
    its tier over an SSD-PS of its options: batches of ``working_set`` new keys, pulled (pinned)
    and pushed back dirty, grow the table to the limit and are flushed, the cache and the index
    within the tier after every batch. The plan counted the index as doubling while the MEM-PS
    writes whole chunks (it failed at the flush of the first three, a rebuild past the plan);
    the MEM-PS made room for the index's next rebuild beside its pinned rows only, not beside the
    batch it was pinning (the 128-B rows: the cache fell to 1,709 rows under a batch of 2,000)."""
    from hps.mem import MemPS, RowInitializer

    p = plan_memory(budget, width, working_set, working_set, window=1, device="cuda", model={"dense": 1 << 20},
                    pipeline=0, rows_per_file=rows_per_file)
    limit = p.max_table_keys
    assert limit > 10 * working_set
    with SSDStore(tmp_path / "s", width, rows_per_file=rows_per_file, options=SSDOptions(**p.ssd_options())) as s:
        m = MemPS(s, width, budget_bytes=p.tier_bytes, initializer=RowInitializer(width // 2, width, seed=1))
        for a in range(0, limit, working_set):
            k = np.arange(a, min(limit, a + working_set), dtype=np.uint64)
            m.push(k, m.pull(k) + 1)
            assert m.cache.nbytes + s.index_bytes() <= p.tier_bytes
        m.flush()
        assert len(s) == limit and m.stats()["dumped"] > 0


#: A job whose rows go up and down the tiers (an HBM-PS of 128 KiB evicting to the MEM-PS, which spills
#: to the SSD-PS, read back) over a table of 2,010 keys of 128-B rows.
CYCLING = ["--rows", "6400", "--fields", "2", "--vocab-per-field", "2000", "--batch-size", "100",
           "--minibatch-size", "50", "--hidden", "4", "--embedding-dim", "16", "--no-progress", "--hbm-budget",
           "128KiB", "--rows-per-file", "32", "--epochs", "2", "--device", "cpu"]


def test_a_table_below_the_plans_limit_trains_while_its_rows_cycle_through_the_tiers(tmp_path, capfd):
    """The smallest budget whose plan holds the table (its printed limit is at least the table's keys)
    trains it to the end, with rows cycling HBM-PS -> MEM-PS -> SSD-PS and back, and ends with the
    in-memory job's model. A dump reserves SSD-PS index room for each of its rows, new or not
    (``KeyIndex.reserve``), and the MEM-PS keeps that room beside its cache: the plan counted the
    table's 2,010 keys (and a compaction's batch) within the index's 2,048, but a chunk of rows
    coming back down asked for a rebuild, and the job stopped ("the table has outgrown this budget")
    below its printed limit of 2,016 keys."""
    from hps.train import load_export, main
    from tests.budgets import spill_budget

    def run(name, extra):
        capfd.readouterr()
        rc = main([*CYCLING, *extra, "--export", str(tmp_path / name), "--metrics-out", str(tmp_path / f"{name}.json")])
        assert rc == 0, capfd.readouterr().err[-3000:]  # the plan and progress go to stdout, errors to stderr
        return load_export(tmp_path / name), json.loads((tmp_path / f"{name}.json").read_text()), capfd.readouterr().out

    (keys, vals, dense), mem, _ = run("memory", [])
    table = mem["table_rows"]
    assert mem["ssd_bytes_read"] == 0 and 2000 < table == keys.shape[0]
    budget = spill_budget(CYCLING, table // 8, table)
    (k2, v2, d2), m, out = run("spill", ["--mem-budget", str(budget)])
    limit = int(re.search(r"a table of up to ([0-9,]+) keys", out).group(1).replace(",", ""))
    assert table <= limit and m["table_rows"] == table
    assert m["hbm_evicted_rows"] > 0 and m["ssd_bytes_read"] > 0   # rows went down to the SSD-PS and came back
    o, o2 = np.argsort(keys), np.argsort(k2)
    np.testing.assert_array_equal(keys[o], k2[o2])
    assert np.abs(vals[o] - v2[o2]).max() <= 1e-5
    for name in dense:
        assert np.abs(dense[name] - d2[name]).max() <= 1e-5, name


def test_the_plan_counts_what_parallel_readers_hold(tmp_path):
    """With --readers N each dataset holds ``units_in_flight(N)`` work units (N x WINDOW_PER_READER
    being made or waiting, one with the consumer): the batches in flight grow by what they hold
    beyond one reader's unit (a synthetic block is a local batch; a text unit is its chunk and
    parsed arrays, within the bytes the shard reads). The plan counted one unit whatever N (6
    readers peaked 70 MiB higher than 1 on 16,384 x 26 fields, outside the plan)."""
    from hps.data import open_dataset
    from hps.data._parallel import WINDOW_PER_READER
    from hps.train import Trainer
    from hps.train._budget import BATCH_ARRAYS, IN_FLIGHT, UNIT_CHUNKS, reader_bytes, units_in_flight
    from hps.cli import parse_config

    assert units_in_flight(1) == 1 and units_in_flight(4) == 4 * WINDOW_PER_READER + 1
    plans = {}
    for n in (1, 4):   # synthetic, through the trainer's plan
        t = Trainer(parse_config([*SMALL, "--readers", str(n), "--mem-budget", "64MB",
                                  "--ssd-path", str(tmp_path / f"ssd{n}")]), log=lambda *a, **k: None)
        try:
            batch = sum(getattr(t.first_batch, f).nbytes for f in BATCH_ARRAYS)
            plans[n] = t.plan.share(IN_FLIGHT)
        finally:
            t.close()
    assert plans[4] - plans[1] == (units_in_flight(4) - 1) * batch > 0
    rows = np.random.default_rng(0).integers(0, 900, (40_000, 4))
    np.savetxt(tmp_path / "d.csv", rows, fmt="%d", delimiter=",", header="click,a,b,c", comments="")
    size = (tmp_path / "d.csv").stat().st_size - len("click,a,b,c\n")   # the lines a shard reads
    for chunk in (64 << 10, 16 << 20):   # the file is ~10 chunks of 64 KiB, and less than one of 16 MiB
        held = {n: reader_bytes([open_dataset(tmp_path / "d.csv", "csv", 1024, chunk_bytes=chunk, readers=n)], n)
                for n in (1, 4)}
        assert held[1] == (UNIT_CHUNKS + 1) * min(chunk, size)
        assert held[4] == UNIT_CHUNKS * min(units_in_flight(4) * chunk, size) + min(chunk, size)
        assert (held[4] > held[1]) == (size > chunk)
