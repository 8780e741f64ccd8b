"""On a real GPU, an MLP's pass with ``HPS_CUDA_LAYERS=kernel`` (a layer's bias and ReLU, and the ReLU's
backward mask, one hps launch each) ends with CuPy's operations' bits: activations, input gradient and
every parameter gradient. (The kernels' bits against NumPy's: tests/cudasim/test_layer_kernels_cudasim.py.)"""

import numpy as np
import pytest

from hps.model._layers import LAYER_STEP, MLP, Scratch

pytestmark = pytest.mark.gpu


@pytest.fixture
def layer_step():
    before = LAYER_STEP.get()
    yield LAYER_STEP.set
    LAYER_STEP.set(before)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_mlp_pass_with_the_layer_kernels_has_the_operations_bits(dtype, layer_step):
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(4)
    mlp = MLP([64, 48, 32, 1])
    p = {k: cp.asarray(v, dtype=dtype) for k, v in mlp.init(rng).items()}
    x = cp.asarray(rng.standard_normal((300, 64)), dtype=dtype)
    dy = cp.asarray(rng.standard_normal((300, 1)), dtype=dtype)
    out = {}
    for step in ("ops", "kernel"):
        layer_step(step)
        ws, grads = Scratch(cp), {}
        h, acts = mlp.forward(cp, p, x, ws)
        dx = mlp.backward(p, acts, dy, grads, ws=ws)
        out[step] = [a.get() for a in (h, dx, *acts)] + [grads[k].get() for k in sorted(grads)]
    for a, b in zip(out["ops"], out["kernel"], strict=True):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
