"""FAE under mpiexec: K ranks end with the model of one process reading the same K shards (hot rows
replicated and all-reduced, hot/cold mini-batches formed alike), also spilling to SSD-PS and with
--sparse-sync allreduce; resume with FAE reproduces an uninterrupted MPI run."""

import json

import pytest

from hps.train import load_export, main
from tests.budgets import SPILL as BUDGET_PLACEHOLDER
from tests.budgets import resolve_spill
from tests.test_train_mpi import SMALL, compare, criteo_args, criteo_file, mpirun

pytestmark = pytest.mark.mpi

FAE = ["--fae", "auto", "--hot-bytes", "32KiB", "--fae-sample-rate", "50"]


@pytest.mark.parametrize("data, extra", [
    ("synthetic", []),
    ("criteo", ["--ranks-per-node", "2", "--mem-budget", BUDGET_PLACEHOLDER, "--rows-per-file", "128",
                "--hbm-budget", "1200KiB"]),
    ("synthetic", ["--sparse-sync", "allreduce"]),
])
def test_two_ranks_with_fae_end_with_the_model_of_one_process(mpiexec, tmp_path, data, extra):
    # criteo spills: a MEM-PS of about one batch's working set per rank beside its SSD-PS index (whose
    # room the cache has while the table is small: rows of 32 floats + state leave it fewer than a
    # rank's cold rows) and an HBM-PS cache of 2,048 rows (a batch's ~1,050 and more), and a second
    # epoch reads back what the first spilled (short and long lines interleaved: every rank's shard has both)
    args = SMALL if data == "synthetic" else [*criteo_args(criteo_file(tmp_path / "train.txt", n=60000,
                                                                       interleaved=True)),
                                              "--embedding-dim", "32", "--epochs", "2"]
    assert main([*args, *FAE, "--data-shards", "2", "--export", str(tmp_path / "one"),
                 "--metrics-out", str(tmp_path / "one.json")]) == 0
    one = json.loads((tmp_path / "one.json").read_text())
    argv = resolve_spill([*args, *FAE, *extra], lambda a: mpirun(mpiexec, 2, a), 1.3 * one["table_rows"] / 2)
    proc = mpirun(mpiexec, 2, [*argv, "--export", str(tmp_path / "two"), "--metrics-out", str(tmp_path / "two.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    compare(load_export(tmp_path / "one", first_order=True), load_export(tmp_path / "two", first_order=True), 1e-5)
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert round(one["auc"], 4) == round(two["auc"], 4)
    f1, f2 = one["fae"], two["fae"]
    assert f1["hot_rows"] > 0 and f1["hot_minibatches"] > 0 and f1["swaps"] > 0
    for k in ("hot_rows", "hot_examples", "hot_minibatches", "cold_minibatches", "swaps", "final_rate"):
        assert f1[k] == f2[k], k
    assert two["bytes_sent"]["dense_allreduce"] > 0  # hot-row gradients travel as a dense all-reduce
    if "--mem-budget" in extra:
        assert min(two["ssd_bytes_read_per_rank"]) > 0


def test_resume_under_mpi_with_fae_reproduces_an_uninterrupted_run(mpiexec, tmp_path):
    out = {}
    for name, epochs, more in (("full", 2, []), ("half", 1, ["--checkpoint-dir", str(tmp_path / "ck")]),
                               ("resumed", 2, ["--checkpoint-dir", str(tmp_path / "ck"), "--resume"])):
        proc = mpirun(mpiexec, 2, [*SMALL, *FAE, "--epochs", str(epochs), *more, "--export", str(tmp_path / name)])
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[name] = load_export(tmp_path / name, first_order=True)
    compare(out["full"], out["resumed"], 1e-5)
