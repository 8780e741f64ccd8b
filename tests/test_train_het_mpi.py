"""``--consistency het`` under mpiexec: s = 0 trains exactly like BSP, checkpoints are consistent cuts
(resume reproduces an uninterrupted run), the caches cut embedding traffic, a killed rank ends the job."""

import json

import pytest

from hps.train import load_export
from tests.budgets import SPILL as BUDGET_PLACEHOLDER
from tests.budgets import resolve_spill
from tests.test_train_mpi import SMALL, compare, criteo_args, criteo_file, kill_rank_mid_run, mpirun

pytestmark = pytest.mark.mpi

SPILL = ["--ranks-per-node", "2", "--mem-budget", BUDGET_PLACEHOLDER, "--rows-per-file", "128"]
SPILL_SYN = ["--mem-budget", BUDGET_PLACEHOLDER, "--rows-per-file", "128"]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return criteo_file(tmp_path_factory.mktemp("data") / "train.txt")


def run(mpiexec, n, args, out):
    proc = mpirun(mpiexec, n, [*args, "--export", str(out / "model"), "--metrics-out", str(out / "m.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_export(out / "model", first_order=True), json.loads((out / "m.json").read_text())


@pytest.mark.parametrize("data, n, extra", [
    ("synthetic", 2, []),
    ("criteo", 4, ["--model", "wdl", *SPILL]),
])
def test_staleness_0_trains_exactly_like_bsp(mpiexec, data_file, tmp_path, data, n, extra):
    args = resolve_spill([*(SMALL if data == "synthetic" else criteo_args(data_file)), *extra],
                         lambda a: mpirun(mpiexec, n, a), 6000 / n)   # the criteo file has about 4,800 keys
    (tmp_path / "bsp").mkdir()
    (tmp_path / "het").mkdir()
    bsp, mb = run(mpiexec, n, [*args, "--consistency", "bsp"], tmp_path / "bsp")
    het, mh = run(mpiexec, n, [*args, "--consistency", "het", "--staleness", "0", "--het-cache", "1MiB"],
                  tmp_path / "het")
    compare(bsp, het, 1e-5)
    assert round(mh["auc"], 4) == round(mb["auc"], 4)
    assert mh["consistency"] == "het" and mh["staleness"] == 0
    assert mh["het_hits"] == 0 and mh["het_fetches"] == mh["het_reads"] > 0  # every entry pushed each mini-batch
    assert mh["het_pushes"] == mh["het_fetches"] and mh["bytes_sent"]["sparse_grads"] == 0


def test_resume_reproduces_an_uninterrupted_het_run(mpiexec, tmp_path):
    """Cuts at every checkpoint point (here every 2 batches and each epoch's end) whether written or
    not: a run stopped after epoch 1 and resumed ends exactly where the uninterrupted one does."""
    args = [*SMALL, "--consistency", "het", "--staleness", "100", "--het-cache", "0.05", "--het-policy", "lru",
            "--checkpoint-every", "2", *SPILL_SYN]
    args = resolve_spill(args, lambda a: mpirun(mpiexec, 2, a), 12_000 / 2)   # 4 fields x 3,000 values
    ck = str(tmp_path / "ck")
    (tmp_path / "full").mkdir()
    full, m = run(mpiexec, 2, [*args, "--epochs", "2"], tmp_path / "full")
    first = mpirun(mpiexec, 2, [*args, "--epochs", "1", "--checkpoint-dir", ck])
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = mpirun(mpiexec, 2, [*args, "--epochs", "2", "--checkpoint-dir", ck, "--resume",
                                  "--export", str(tmp_path / "resumed")])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    compare(full, load_export(tmp_path / "resumed", first_order=True), 0.0)
    # the caches worked: hits, fetches, evictions, every fetched entry pushed back in the end
    assert 0 < m["het_hit_rate"] < 1 and m["het_pushes"] > 0 and m["het_evictions"] > 0
    assert m["het_reads"] == m["het_hits"] + m["het_misses"] + m["het_invalidations"]
    assert m["het_pushes"] == m["het_fetches"]  # each entry was written once at least, then pushed


def test_het_sends_fewer_embedding_bytes_than_bsp(mpiexec, tmp_path):
    """Row-wise Adagrad (a fetched row is its P parameters, 1 accumulator and a clock), an unbounded
    staleness and a cache of half the table: every read after a key's first hits (this small job
    reads a key about 3 times, so the hit rate is about 2/3), and rows, clocks, flags and pushes
    together weigh much less than BSP's rows and gradients; the plan's keys are BSP's."""
    args = [*SMALL, "--sparse-optimizer", "rowwise-adagrad"]
    (tmp_path / "bsp").mkdir()
    (tmp_path / "het").mkdir()
    _, mb = run(mpiexec, 2, args, tmp_path / "bsp")
    _, m = run(mpiexec, 2, [*args, "--consistency", "het", "--staleness", "inf", "--het-cache", "0.5"],
               tmp_path / "het")
    sent, bsent = m["bytes_sent"], mb["bytes_sent"]
    het = sent["sparse_rows"] + sent["het_push"] + sent["het_clocks"] + sent["het_control"]
    assert het < 0.6 * (bsent["sparse_rows"] + bsent["sparse_grads"])
    assert sent["sparse_keys"] == bsent["sparse_keys"] and sent["sparse_grads"] == 0
    assert m["het_invalidations"] == 0 and m["het_hit_rate"] > 0.5 and m["staleness"] == "inf"
    assert abs(m["auc"] - mb["auc"]) < 0.02


def test_a_killed_rank_ends_a_het_job(mpiexec, tmp_path):
    proc, took = kill_rank_mid_run(mpiexec, tmp_path, "--consistency", "het")
    assert proc.returncode != 0 and took < 60
