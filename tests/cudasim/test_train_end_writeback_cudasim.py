"""``--device cuda`` on the simulator: a job without ``--export`` leaves the resident rows in the HBM-PS
and counts its model size over the tiers, listing the HBM-PS's keys (8 B each, ``writeback``) instead
of bringing every row down (``hps/train/_hierarchy.py``: ``owned_rows``)."""

import json

import pytest

from hps.train import main
from tests.cudasim.test_train_device_cuda_cudasim import CASES, TINY, run

pytestmark = pytest.mark.cudasim


def test_a_cuda_job_without_export_counts_the_rows_it_leaves_in_the_hbm_ps(tmp_path, no_warm_up):
    """One table (``--n-parts``' key listing is checked against its export in ``test_table_cudasim``;
    a whole job of it here would add ~90 s of simulator time to CI)."""
    extra = ["--vocab-per-field", "1000", "--hbm-budget", "12KiB"]
    _, me = run(tmp_path, "cuda", extra)
    metrics = tmp_path / "plain.json"
    assert main([*TINY, *extra, "--device", "cuda", "--metrics-out", str(metrics)]) == 0
    m = json.loads(metrics.read_text())
    assert m["table_rows"] == me["table_rows"] and m["hbm_evicted_rows"] == me["hbm_evicted_rows"] > 0
    assert m["loss_per_batch"] == pytest.approx(me["loss_per_batch"], abs=1e-6)  # device sums: not bitwise
    row = 8 + 4 * CASES["ctr-adagrad"][1]  # a key and its row
    resident = m["hbm_fetched_rows"] - m["hbm_evicted_rows"]  # rows in the HBM-PS at the end
    assert resident > 0 and me["d2h_bytes"]["writeback"] == me["hbm_fetched_rows"] * row
    assert m["d2h_bytes"]["writeback"] == m["hbm_evicted_rows"] * row + 8 * resident
