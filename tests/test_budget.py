"""--mem-budget bounds the process: the MEM-PS cache with its maps and ghost table and the SSD-PS
buffers fit in it, the rest is printed at start, and a budget below one batch's working set is a
clear error before training starts."""

import re
import subprocess
import sys

import numpy as np
import pytest

from hps.errors import InvalidInputError
from hps.mem import RowCache
from hps.ssd import SSDOptions, SSDStore
from hps.train._budget import budget_for_rows, plan_memory

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


@pytest.mark.parametrize("budget", [1 << 20, 64 << 20, 8 << 30])
def test_plan_fits_the_budget(budget):
    p = plan_memory(budget, 32, 1000, 1500, window=3, device="cpu")
    assert p.cache_bytes + p.ssd_buffer_bytes <= budget
    assert RowCache.bytes_for(p.cache_rows + 1, 32) + p.ssd_buffer_bytes > budget   # nothing left unused
    assert p.hbm_keys == 2 * 4 * 1500 and p.hbm_dram_bytes > 2 * 4 * 1500 * 128
    assert plan_memory(budget, 32, 1000, 1500, window=3, device="cuda").hbm_dram_bytes == 0
    line = p.describe()
    assert line.startswith("budget ") and "MEM-PS cache" in line and "per key of the table" in line
    assert p.pipeline_bytes == 3 * 1000 * 128 and "batches in flight 375.0 KiB" in line
    SSDOptions(**p.ssd_options())      # valid SSD-PS options


@pytest.mark.parametrize("rows, width", [(1, 16), (1000, 32), (40_000, 32), (300_000, 384)])
def test_budget_for_rows_is_the_smallest_that_caches_them(rows, width):
    b = budget_for_rows(rows, width)
    assert plan_memory(b, width, rows, rows, window=3, device="cuda").cache_rows >= rows
    with pytest.raises(InvalidInputError):
        plan_memory(b - 4096, width, rows, rows, window=3, device="cuda")


def test_plan_refuses_a_budget_below_the_working_set_and_names_one_that_works():
    with pytest.raises(InvalidInputError, match="raise --mem-budget to at least") as ei:
        plan_memory(1 << 20, 32, 10_000, 10_000, window=3, device="cpu")
    enough = int(re.search(r"at least (\d+) B", str(ei.value)).group(1))
    assert plan_memory(enough, 32, 10_000, 10_000, window=3, device="cpu").cache_rows >= 10_000


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


def test_cli_prints_the_plan_and_refuses_a_small_budget_before_training(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "hps.train", *SMALL, "--mem-budget", "4MB"], capture_output=True,
                        text=True, timeout=300, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "hps: budget 4.0 MiB: MEM-PS cache" in ok.stdout and "HBM-PS twin" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "hps.train", *SMALL, "--mem-budget", "100KB"], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 2
    assert "cannot hold one batch's working set" in bad.stderr and "Traceback" not in bad.stderr
    assert "training" not in bad.stdout          # refused before the pipeline started


def test_ssd_page_cache_flag_names_the_store_policies():
    from hps.config import PAGE_CACHE_MODES, TierConfig
    from hps.ssd._fileio import PAGE_CACHE_MODES as STORE_MODES

    assert PAGE_CACHE_MODES == STORE_MODES and TierConfig().ssd_page_cache == SSDOptions().page_cache
    with pytest.raises(InvalidInputError, match="ssd-page-cache"):
        TierConfig(ssd_page_cache="sometimes")
