"""N ranks end with the model of one process reading N shards bit for bit, after hundreds of Adam
steps: every sum across ranks (dense gradients, FAE's hot rows riding with them, sparse gradients at
their owners or in the sparse all-reduce) adds the ranks' contributions in rank order, and one process
trains each shard apart and folds the shards in shard order (DESIGN.md, "Reductions have a fixed
order"). With MPI's own Allreduce the same job drifted by up to 6e-6 here (1.8e-2 on 600 k lines)."""

import json

import pytest

from hps.train import load_export, main
from tests.budgets import SPILL as BUDGET_PLACEHOLDER
from tests.budgets import resolve_spill
from tests.test_train_mpi import compare, criteo_file, mpirun

pytestmark = pytest.mark.mpi

# 60,000 lines in global mini-batches of 256: 235 Adam steps of a 64-32 MLP. One BLAS thread on both
# sides, so each shard's matrix products run the same kernel in one process and in its rank.
LONG = ["--batch-size", "4096", "--minibatch-size", "256", "--hidden", "64,32", "--embedding-dim", "16",
        "--blas-threads", "1", "--no-progress"]
# the ranks' MEM-PS holds one batch's working set and their HBM-PS cache 2,048 rows (1 MiB), together
# less than a rank's ~4,600 rows: rows go to SSD and come back
SPILL = ["--mem-budget", BUDGET_PLACEHOLDER, "--rows-per-file", "128", "--hbm-budget", "1MiB"]


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    # every shard holds short and long lines: each rank's MEM-PS under SPILL holds less than its rows
    return criteo_file(tmp_path_factory.mktemp("long") / "train.txt", n=60000, interleaved=True)


@pytest.mark.parametrize("n, both, ranks_only", [
    (4, [], []),
    (2, [], SPILL),
    (2, ["--sparse-sync", "allreduce", "--fae", "auto", "--hot-bytes", "64KB"], []),  # hot rows ride the dense sum
])
def test_ranks_equal_one_process_bit_for_bit_over_hundreds_of_steps(mpiexec, long_file, tmp_path, n, both,
                                                                   ranks_only):
    data = ["--format", "criteo", "--data", str(long_file), "--eval-data", str(long_file), *LONG, *both]
    one, ranks = tmp_path / "one", tmp_path / "ranks"
    one.mkdir(), ranks.mkdir()
    assert main([*data, "--data-shards", str(n), "--export", str(one / "model"),
                 "--metrics-out", str(one / "m.json")]) == 0
    m1 = json.loads((one / "m.json").read_text())
    argv = resolve_spill([*data, *ranks_only], lambda a: mpirun(mpiexec, n, a), 1.3 * m1["table_rows"] / n)
    proc = mpirun(mpiexec, n, [*argv, "--export", str(ranks / "model"), "--metrics-out", str(ranks / "m.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    mn = json.loads((ranks / "m.json").read_text())
    # batches of 16 mini-batches
    assert len(m1["loss_per_batch"]) * 16 >= 235 and m1["examples"] == mn["examples"] == 60000
    if ranks_only:
        assert min(mn["ssd_bytes_read_per_rank"]) > 0  # every rank spilled to SSD and read back
    compare(load_export(one / "model", first_order=True), load_export(ranks / "model", first_order=True), 0.0)
    assert round(m1["auc"], 4) == round(mn["auc"], 4)
