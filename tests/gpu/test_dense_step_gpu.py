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


@pytest.mark.parametrize("step", ["ops", "kernel"])
@pytest.mark.parametrize("make", [lambda: DenseAdam(0.01), lambda: DenseAdagrad(0.05)], ids=["adam", "adagrad"])
def test_cupy_tensors_of_one_buffer_step_at_once_with_the_per_tensor_bits(make, step, monkeypatch):
    """CuPy parameters and gradients laid out in one buffer each (``hps/model/_flat.py``) step in one pass
    (13 CuPy operations or one launch for all tensors) with the bits of stepping them one by one."""
    cp = pytest.importorskip("cupy")
    from hps.model import flat_views

    monkeypatch.setenv("HPS_DENSE_STEP", step)
    shapes = {"W0": (300, 70), "b0": (70,), "W1": (70, 1), "b1": (1,)}
    rng = np.random.default_rng(4)
    start = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    tiled, plain = flat_views(cp, shapes, np.float32), {k: cp.asarray(v) for k, v in start.items()}
    for k, v in start.items():
        tiled[k][...] = cp.asarray(v)
    opt_t, opt_p = make(), make()
    for _ in range(5):
        g = flat_views(cp, shapes, np.float32)
        g.flat[...] = cp.asarray(rng.standard_normal(g.flat.shape[0]).astype(np.float32))
        opt_t.step(tiled, g)
        opt_p.step(plain, {k: v.copy() for k, v in g.items()})
    assert opt_t._tiled is not None
    for k in shapes:
        np.testing.assert_array_equal(cp.asnumpy(tiled[k]), cp.asnumpy(plain[k]))
