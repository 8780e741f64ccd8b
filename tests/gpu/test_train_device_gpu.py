"""``python -m hps.train --device cuda`` on a real GPU (skips itself without one): the twins of
``tests/cudasim/test_train_device_cuda_cudasim.py`` with CuPy as the array module, real streams and
atomics. The same checks: the CPU backend's model (max abs diff <= 1e-5) and AUC, and a ledger with
no row, key or gradient inside the mini-batch loop."""

import numpy as np
import pytest

from tests.cudasim.test_train_device_cuda_cudasim import CASES, assert_ledger, assert_same_model, run

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("case", sorted(CASES))
def test_device_cuda_trains_on_the_gpu_like_the_cpu(tmp_path, case):
    pytest.importorskip("cupy")
    args, width = CASES[case]
    ec, mc = run(tmp_path, "cpu", args)
    eg, mg = run(tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert round(mg["auc"], 4) == round(mc["auc"], 4)
    assert np.allclose(mg["loss_per_batch"], mc["loss_per_batch"], rtol=1e-5)
    assert_ledger(mg, width, batches=3, fetched=mg["table_rows"])


def test_parts_on_every_gpu_train_like_the_cpu(tmp_path):
    """--n-parts 4 over every visible GPU (one GPU: all parts share it, no peer copies)."""
    pytest.importorskip("cupy")
    from hps.gpu import visible_gpus

    args = ["--n-parts", "4", "--sparse-optimizer", "adam", "--hbm-capacity", "8"]
    ec, mc = run(tmp_path, "cpu", args)
    eg, mg = run(tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert round(mg["auc"], 4) == round(mc["auc"], 4)
    assert_ledger(mg, 3 + 7, batches=3, fetched=mg["table_rows"], n_parts=4)
    assert (mg["peer_bytes"] > 0) == (visible_gpus() > 1)
