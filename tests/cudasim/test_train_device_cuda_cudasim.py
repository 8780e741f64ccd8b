"""``--device cuda`` through the array-module seam under the CUDA simulator: NumPy stands in for CuPy
and the HBM-PS is the CUDA table on the simulated GPU, so the cuda training path runs in CI.

This is today's ``--device cuda`` path (rows still cross to the host per mini-batch; the GPU-resident
kernels of hps.gpu are not wired into the trainer yet). Tiny on purpose: the simulator runs every
table kernel thread in Python.
"""

import json

import numpy as np
import pytest

from hps.train import load_export, main

pytestmark = pytest.mark.cudasim

TINY = ["--rows", "300", "--fields", "2", "--vocab-per-field", "40", "--batch-size", "100",
        "--minibatch-size", "50", "--hidden", "4", "--embedding-dim", "3", "--no-progress"]


def run(tmp_path, device):
    out, metrics = tmp_path / device, tmp_path / f"{device}.json"
    assert main([*TINY, "--device", device, "--export", str(out), "--metrics-out", str(metrics)]) == 0
    return load_export(out), json.loads(metrics.read_text())


def test_device_cuda_trains_on_the_simulated_gpu_like_the_cpu(tmp_path):
    (kc, vc, dc), mc = run(tmp_path, "cpu")
    (kg, vg, dg), mg = run(tmp_path, "cuda")
    oc, og = np.argsort(kc), np.argsort(kg)
    np.testing.assert_array_equal(kc[oc], kg[og])
    assert np.abs(vc[oc] - vg[og]).max() <= 1e-5
    for name in dc:
        assert np.abs(dc[name] - dg[name]).max() <= 1e-5, name
    assert mg["examples"] == mc["examples"] == 300
    assert round(mg["auc"], 4) == round(mc["auc"], 4)
