"""Multi-process training under mpiexec: lossless against one process, and fail-fast."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from hps.train import load_export, main

pytestmark = pytest.mark.mpi

SMALL = ["--rows", "12000", "--fields", "4", "--vocab-per-field", "3000", "--batch-size", "2048",
         "--minibatch-size", "256", "--hidden", "16,8", "--embedding-dim", "8", "--no-progress"]


def mpirun(mpiexec, n, args, timeout=300):
    return subprocess.run([mpiexec, "-n", str(n), sys.executable, "-m", "hps.train", *args],
                          capture_output=True, text=True, timeout=timeout)


def compare(a, b, tol):
    (ka, va, da, fa), (kb, vb, db, fb) = (x if len(x) == 4 else (*x, None) for x in (a, b))
    oa, ob = np.argsort(ka), np.argsort(kb)
    np.testing.assert_array_equal(ka[oa], kb[ob])
    assert np.abs(va[oa] - vb[ob]).max() <= tol
    assert (fa is None) == (fb is None)
    if fa is not None:
        assert np.abs(fa[oa] - fb[ob]).max() <= tol
    for k in da:
        assert np.abs(da[k] - db[k]).max() <= tol, k


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The single-process run of ``SMALL`` + model flags (export with first-order weights, metrics)."""
    done = {}

    def get(model_args):
        key = tuple(model_args)
        if key not in done:
            d = tmp_path_factory.mktemp("single")
            assert main([*SMALL, *model_args, "--export", str(d / "model"), "--metrics-out", str(d / "m.json")]) == 0
            done[key] = load_export(d / "model", first_order=True), json.loads((d / "m.json").read_text())
        return done[key]

    return get


SPILL = ["--ranks-per-node", "2", "--mem-budget", "280KB", "--rows-per-file", "256"]


@pytest.mark.parametrize("n, model, extra", [
    (2, [], []),
    (4, [], SPILL),
    (4, ["--model", "wdl"], SPILL),      # first-order weights in the rows, over ranks and SSD
    (2, ["--model", "dlrm"], []),
])
def test_ranks_end_with_the_single_process_model(mpiexec, single, tmp_path, n, model, extra):
    ref, mref = single(model)
    proc = mpirun(mpiexec, n, [*SMALL, *model, *extra, "--export", str(tmp_path / "model"),
                               "--metrics-out", str(tmp_path / "m.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    compare(ref, load_export(tmp_path / "model", first_order=True), 1e-5)
    m = json.loads((tmp_path / "m.json").read_text())
    assert round(m["auc"], 4) == round(mref["auc"], 4)
    assert m["ranks"] == n and m["bytes_sent"]["sparse_allreduce"] > 0
    assert m["bytes_sent_per_example"]["sparse_pull"] > 0 and m["bytes_sent"]["owner_writeback"] == 0
    assert len(list((tmp_path / "model").glob("sparse-rank*-of-%d.h5" % n))) == n
    if extra:
        assert m["ssd_bytes_read"] > 0  # rank 0 spilled to SSD and read back


def test_resume_with_the_same_ranks_reproduces_an_uninterrupted_run(mpiexec, tmp_path):
    ck = str(tmp_path / "ck")
    full = mpirun(mpiexec, 2, [*SMALL, "--epochs", "2", "--export", str(tmp_path / "full")])
    assert full.returncode == 0, full.stderr[-2000:]
    first = mpirun(mpiexec, 2, [*SMALL, "--epochs", "1", "--checkpoint-dir", ck])
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = mpirun(mpiexec, 2, [*SMALL, "--epochs", "2", "--checkpoint-dir", ck, "--resume",
                                  "--export", str(tmp_path / "resumed")])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    compare(load_export(tmp_path / "full"), load_export(tmp_path / "resumed"), 0.0)
    wrong = subprocess.run([sys.executable, "-m", "hps.train", *SMALL, "--epochs", "2", "--checkpoint-dir", ck,
                            "--resume"], capture_output=True, text=True, timeout=300)
    assert wrong.returncode != 0 and "same number of ranks" in wrong.stderr


def test_a_failing_rank_takes_the_job_down_with_its_name(mpiexec, tmp_path):
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    (ssd / "rank1-of-2").write_text("not a directory")  # rank 1 cannot create its SSD-PS
    t = time.time()
    proc = mpirun(mpiexec, 2, [*SMALL, "--ssd-path", str(ssd)], timeout=120)
    assert proc.returncode != 0
    assert time.time() - t < 60
    assert "rank 1 of 2 failed" in proc.stderr


def test_a_killed_rank_takes_the_job_down(mpiexec, tmp_path):
    marker = str(tmp_path / "ssd-kill")
    proc = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "hps.train", *SMALL,
                             "--rows", "400000", "--ssd-path", marker],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.time() + 60
    while victim is None and time.time() < deadline:
        time.sleep(0.2)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if marker.encode() in cmd and b"PMI_RANK=1" in env and b"hps.train" in cmd:
                victim = int(pid)
    assert victim is not None, "rank 1 never started"
    time.sleep(2)
    t = time.time()
    os.kill(victim, 9)
    proc.wait(timeout=90)
    assert proc.returncode != 0
    assert time.time() - t < 60
