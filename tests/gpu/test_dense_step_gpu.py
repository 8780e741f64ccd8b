"""On a real GPU, a CuPy tensor's dense Adam and Adagrad steps with ``HPS_DENSE_STEP=kernel`` (one CUDA
launch a tensor, ``hps/model/_dense_kernels_cuda.py``) equal the default's CuPy operations to rounding
(the GPU compiler may fuse a multiply and an add), over several steps."""

import numpy as np
import pytest

from hps.model import DenseAdagrad, DenseAdam

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("make", [lambda: DenseAdam(0.01), lambda: DenseAdagrad(0.05)], ids=["adam", "adagrad"])
def test_one_launch_a_tensor_equals_the_cupy_operations(make, monkeypatch):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal((300, 70)).astype(np.float32)
    grads = [rng.standard_normal((300, 70)).astype(np.float32) for _ in range(5)]
    out = {}
    for step in ("ops", "kernel"):
        monkeypatch.setenv("HPS_DENSE_STEP", step)
        opt, w = make(), cp.asarray(w0)
        for g in grads:
            opt.step({"w": w}, {"w": cp.asarray(g)})
        out[step] = cp.asnumpy(w)
    assert not np.array_equal(out["ops"], w0)
    np.testing.assert_allclose(out["kernel"], out["ops"], rtol=1e-5, atol=1e-6)
