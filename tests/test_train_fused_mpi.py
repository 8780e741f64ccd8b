"""The fused train step under mpiexec (``--sparse-sync owner``, ``--dense-sync allreduce``, uncompressed, on
the host; ``_sync.OwnerSync``): the dense reduce-scatter rides in the sparse gradients' alltoallv and the
allgather of the stepped blocks in the next mini-batch's rows exchange, completed on its own at the end of
each batch. Whatever reads the dense parameters between mini-batches must see them whole: an evaluation
after every batch, a checkpoint after every batch and a resume from one give exactly what one process
reading the same shards gives (which has no allgather to defer). The long run of hundreds of Adam steps is
``test_train_mpi_order`` (4 ranks, this path); FAE's all-hot mini-batches are ``test_train_fae_mpi``'s."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hps.train import load_export, main
from tests.test_train_mpi import SMALL, compare, criteo_args, criteo_file, mpirun

pytestmark = pytest.mark.mpi

COUNT = Path(__file__).resolve().parent / "mpi" / "count_train.py"


def _curve(m):
    return [(c["batch"], c["examples"], round(c["auc"], 7), round(c["logloss"], 7)) for c in m["eval_curve"]]


def test_evaluations_checkpoints_and_a_resume_between_batches_see_the_whole_dense_parameters(mpiexec, tmp_path):
    data = criteo_file(tmp_path / "train.txt", n=12000, interleaved=True)
    args = [*criteo_args(data), "--eval-every", "1", "--blas-threads", "1", "--lr", "0.5", "--dense-lr", "0.01"]
    one, ck = tmp_path / "one", tmp_path / "ck"
    assert main([*args, "--epochs", "2", "--data-shards", "2", "--export", str(one),
                 "--metrics-out", str(tmp_path / "one.json")]) == 0
    first = mpirun(mpiexec, 2, [*args, "--epochs", "1", "--checkpoint-dir", str(ck), "--checkpoint-every", "1",
                                "--metrics-out", str(tmp_path / "first.json")])
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = mpirun(mpiexec, 2, [*args, "--epochs", "2", "--checkpoint-dir", str(ck), "--checkpoint-every", "1",
                                  "--resume", "--export", str(tmp_path / "two"),
                                  "--metrics-out", str(tmp_path / "two.json")])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    compare(load_export(one, first_order=True), load_export(tmp_path / "two", first_order=True), 0.0)
    m1, mf, m2 = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "first", "two"))
    # 6 batches of 8 mini-batches an epoch: each evaluation reads the parameters a deferred allgather completes
    assert len(m1["eval_curve"]) == 12 and len(mf["eval_curve"]) == 6
    assert _curve(mf) == _curve(m1)[:6]
    assert _curve(m2)[-6:] == _curve(m1)[-6:]
    assert m2["bytes_sent"]["dense_allreduce"] > 0 and m2["bytes_sent"]["sparse_rows"] > 0


def test_a_minibatch_makes_two_collectives_on_the_train_channel(mpiexec, tmp_path):
    # 3 batches of 8 mini-batches: per mini-batch the gradients' alltoallv carries the reduce-scatter, the
    # rows' alltoallv the previous step's allgather (a plain one opens each batch), and each batch ends
    # with the allgather on its own; nothing else but the loss's sum per batch
    args = [*SMALL, "--rows", str(3 * 2048), "--epochs", "1"]                 # 2 ranks: 3,072 examples each
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, str(COUNT), *args], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = {int(r): json.loads(c) for r, c in re.findall(r"count_train rank (\d+): (\{[^{}]*\})", proc.stdout)}
    assert sorted(counts) == [0, 1] and counts[0] == counts[1]
    c = counts[0]
    assert c["alltoallv_blocks"] == 2 * 24 - 3 and c.get("alltoallv") == 3 and c.get("allgather_chunks") == 3
    assert "start_reduce_scatter" not in c
    assert c["_call"] - c["allsum_array"] == 2 * 24 + 3  # the MPI calls (waits) of the train step
