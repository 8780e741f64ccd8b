"""The HBM-PS as a cache across batches on Numba's CUDA simulator (``--hbm-budget``,
``hps/train/_hierarchy.py``): a table that fits uploads each row once, however often it is used
again; a budget that forces evictions (victims chosen by the table's slot score on the device, written
down in one batched call) and a MEM-PS that spills to the SSD-PS end with the CPU's model, and so does
a job resumed from a checkpoint taken while dirty rows were resident in the HBM-PS."""

import shutil

import pytest

from hps.train import load_export
from tests.budgets import train_with_cache_rows
from tests.cudasim.test_train_device_cuda_cudasim import (
    CASES,
    TINY,
    assert_device_dedup,
    assert_ledger,
    assert_same_model,
    run,
)

pytestmark = pytest.mark.cudasim

#: 3 batches an epoch of ~120 keys each over ~260 keys: 128 rows of HBM-PS (12 KiB of 48 B slots at
#: load 0.5) hold a batch but not the table, and a MEM-PS cache of a quarter of the table's rows, the
#: same on both devices, holds fewer than the rows the HBM-PS evicts: rows spill to the SSD-PS and are
#: read back. (A byte budget whose cache is that small leaves no room, in the memory plan, for the
#: SSD-PS index of this table: the plan promises it 0 keys. Hence ``tests/budgets.train_with_cache_rows``.)
SHAPE = ["--vocab-per-field", "1000", "--hbm-budget", "12KiB", "--rows-per-file", "32"]
CACHE_ROWS = 64


def run_spill(tmp_path, device, extra=()):
    """The spilling job on ``device`` -> (its export, metrics)."""
    out = tmp_path / device
    m = train_with_cache_rows([*TINY, *SHAPE, *extra, "--device", device], CACHE_ROWS, out)
    return load_export(out, first_order=True), m


@pytest.fixture(scope="module")
def cpu_spill(tmp_path_factory):
    """The spilling job on the CPU over two epochs, (export, metrics): what both the evicting and the
    resumed cuda jobs must end with (one run for the module)."""
    return run_spill(tmp_path_factory.mktemp("cpu_spill"), "cpu", ["--epochs", "2"])


def test_a_table_that_fits_uploads_each_row_once_over_epochs(tmp_path, no_warm_up):
    """Two epochs: every key is used again after it left the residency window, and no row goes up
    twice (fetch = the table's rows, once each); the CPU twin ends with the same model."""
    args = ["--epochs", "2"]
    ec, mc = run(tmp_path, "cpu", args)
    eg, mg = run(tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert mg["hbm_fetched_rows"] == mg["table_rows"] == mc["hbm_fetched_rows"] and mg["hbm_evicted_rows"] == 0
    assert_ledger(mg, CASES["ctr-adagrad"][1], batches=6, fetched=mg["table_rows"])
    assert_device_dedup(mg, batches=6)


def test_evictions_and_ssd_spills_end_like_the_cpu(tmp_path, cpu_spill, no_warm_up):
    ec, mc = cpu_spill
    eg, mg = run_spill(tmp_path, "cuda", ["--epochs", "2"])
    assert_same_model(ec, eg)
    assert mg["hbm_evicted_rows"] == mc["hbm_evicted_rows"] > 0   # the same victims' count
    assert mg["hbm_fetched_rows"] == mc["hbm_fetched_rows"] > mg["table_rows"]
    assert mg["ssd_bytes_read"] > 0 and max(mg["resident_rows"]) <= 128
    assert_ledger(mg, CASES["ctr-adagrad"][1], batches=6, fetched=mg["hbm_fetched_rows"])
    assert_device_dedup(mg, batches=6)


def test_a_resumed_job_ends_like_the_uninterrupted_cpu_job(tmp_path, cpu_spill, no_warm_up):
    """A checkpoint taken after batch 1 (dirty rows resident in the HBM-PS, batches prepared ahead
    inserted there) holds the current rows: resumed for a second epoch, the job ends like the CPU's
    uninterrupted one."""
    full, _ = cpu_spill
    ck = tmp_path / "ck"
    (tmp_path / "half").mkdir()
    run_spill(tmp_path / "half", "cuda", ["--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                                          "--keep-checkpoints", "2"])
    newest = (ck / "LATEST").read_text().strip()
    shutil.rmtree(ck / newest)             # resume falls back to the checkpoint after batch 1
    (tmp_path / "resumed").mkdir()
    resumed, m = run_spill(tmp_path / "resumed", "cuda", ["--epochs", "2", "--checkpoint-dir", str(ck), "--resume"])
    assert m["hbm_evicted_rows"] > 0
    assert_device_dedup(m, batches=4)  # the batches after the checkpoint
    assert_same_model(full, resumed)

