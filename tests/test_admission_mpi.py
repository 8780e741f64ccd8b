"""docs/admission.md and docs/training.md under mpiexec: admission, expiry, shuffling, schedules and early
stopping decided the same way by 2 ranks as by one process reading the same 2 shards (owners decide; the
ranks agree)."""

import json

import pytest

from hps.train import load_export, main
from tests.test_train import SMALL
from tests.test_train_mpi import compare, mpirun

pytestmark = pytest.mark.mpi

CASES = {
    "admission+expiry+shuffle": ["--admit-after", "2", "--expire-after", "3", "--drift", "0.1",
                                 "--shuffle-buffer", "1000", "--lr-warmup", "4", "--eval-every", "2"],
    "early-stop": ["--epochs", "3", "--eval-every", "1", "--early-stop", "2", "--lr", "5", "--dense-lr", "0.05",
                   "--expire-after", "4"],
}


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_decide_like_one_process_reading_two_shards(mpiexec, tmp_path, case):
    flags = [*SMALL, *CASES[case]]
    assert main([*flags, "--data-shards", "2", "--export", str(tmp_path / "one"),
                 "--metrics-out", str(tmp_path / "one.json")]) == 0
    proc = mpirun(mpiexec, 2, [*flags, "--export", str(tmp_path / "two"),
                               "--metrics-out", str(tmp_path / "two.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    compare(load_export(tmp_path / "one", first_order=True), load_export(tmp_path / "two", first_order=True), 1e-5)
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    for k in ("admitted_keys", "expired_keys", "known_keys", "table_rows", "early_stopped_after_batch"):
        assert one.get(k) == two.get(k), k
    assert [c["batch"] for c in one["eval_curve"]] == [c["batch"] for c in two["eval_curve"]]
    assert round(one["auc"], 4) == round(two["auc"], 4)
    if case == "early-stop":
        assert two["early_stopped_after_batch"] is not None
    else:
        assert two["admitted_keys"] > 0 and two["expired_keys"] > 0
