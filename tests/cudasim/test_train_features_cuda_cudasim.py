"""Every training feature on ``--device cuda`` (Numba's CUDA simulator) ends with the model of ``--device
cpu``: the one train step (``hps/train/_sync.py``, ``_het_sync.py``, ``_dense_sync.py``, ``_easgd.py``)
runs over the GPU backend (``_device_backend.py``) exactly as over the CPU one, so HET (s = 0 and s > 0),
EASGD with 2 groups, bf16 and int8 compression, FAE, admission/expiry and a learning-rate schedule that
decays to 0 all equal the CPU (max abs diff <= 1e-5 over the export). The options about ranks run under
``mpiexec -n 2``. Tiny on purpose: the simulator runs every kernel thread in Python.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hps.train import load_export, main
from tests.cudasim.test_train_device_cuda_cudasim import assert_same_model

pytestmark = pytest.mark.cudasim

REPO = Path(__file__).resolve().parents[2]
#: an HBM-PS of 128 keys at first holds these tables (80 keys at most; see the same flag in
#: test_train_device_cuda_cudasim.py's TINY)
TINY = ["--rows", "400", "--fields", "2", "--vocab-per-field", "40", "--batch-size", "100",
        "--minibatch-size", "50", "--hidden", "4", "--embedding-dim", "3", "--no-progress", "--hbm-capacity", "128"]
FAE = ["--fae", "auto", "--hot-bytes", "1KiB", "--fae-sample-rate", "100"]


def run(tmp_path, device, args):
    out, metrics = tmp_path / device, tmp_path / f"{device}.json"
    assert main([*TINY, *args, "--device", device, "--export", str(out), "--metrics-out", str(metrics)]) == 0
    return load_export(out, first_order=True), json.loads(metrics.read_text())


def mpirun(mpiexec, tmp_path, device, args):
    out, metrics = tmp_path / device, tmp_path / f"{device}.json"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(REPO))
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "hps.train", *TINY, *args, "--device", device,
                        "--export", str(out), "--metrics-out", str(metrics)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return load_export(out, first_order=True), json.loads(metrics.read_text())


def test_fae_and_a_schedule_decaying_to_zero_train_like_the_cpu(tmp_path):
    """FAE's hot rows live on the device (pinned once, stepped there); a cosine decay reaches a learning
    rate of 0, which the row kernels take as the CPU's do."""
    args = [*FAE, "--lr-warmup", "2", "--lr-decay", "cosine", "--lr-decay-steps", "4"]
    ec, mc = run(tmp_path, "cpu", args)
    eg, mg = run(tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert mg["fae"]["hot_examples"] == mc["fae"]["hot_examples"] > 0
    assert mg["fae"]["swaps"] == mc["fae"]["swaps"]
    assert np.allclose(mg["loss_per_batch"], mc["loss_per_batch"], rtol=1e-5)
    assert mg["h2d_bytes"]["fetch"] > 0 and mg["d2h_bytes"]["writeback"] > 0   # hot rows pinned, written back
    assert mg["h2d_bytes"]["mpi"] == mg["d2h_bytes"]["mpi"] == 0                 # one rank: no staging


#: option -> the metrics that show it ran (name -> predicate on the metrics)
RANK_CASES = {
    # HET at staleness 2 fetches (misses) and hits its cache; staleness 0 (fetches only) is a subset of its
    # paths, and its equality to BSP is tested on the CPU (tests/test_train_het_mpi.py)
    "het-s2": (["--consistency", "het", "--staleness", "2", "--het-cache", "0.2"], lambda m: m["het_hits"] > 0),
    "easgd-g2-bf16": (["--dense-sync", "easgd", "--groups", "2", "--easgd-every", "2", "--compress", "bf16"],
                      lambda m: m["easgd_rounds"] > 0 and m["compress"] == "bf16"),
    "int8-admission-expiry": (["--compress", "int8", "--admit-after", "2", "--expire-after", "3",
                               "--vocab-per-field", "400"], lambda m: m["expired_keys"] > 0 < m["admitted_keys"]),
    "fae": (FAE, lambda m: m["fae"]["hot_examples"] > 0),
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(RANK_CASES))
def test_two_ranks_with_each_feature_end_like_the_cpu(tmp_path, mpiexec, case):
    """Two ranks, each on its simulated GPU: MPI's buffers are staged through the host (``mpi`` bytes);
    the options about ranks — HET's caches and clocks, EASGD's groups, compressed exchanges, admission
    at the owners, FAE's hot all-reduce (fused with the dense one) — give the CPU's model."""
    args, ran = RANK_CASES[case]
    ec, mc = mpirun(mpiexec, tmp_path, "cpu", args)
    eg, mg = mpirun(mpiexec, tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert ran(mc) and ran(mg)
    assert round(mg["auc"], 4) == round(mc["auc"], 4)
    assert mg["h2d_bytes"]["mpi"] > 0 and mg["d2h_bytes"]["mpi"] > 0
    assert mg["h2d_bytes"]["minibatch"] == 0
