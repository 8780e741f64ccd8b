"""The MLP's elementwise kernels (``HPS_CUDA_LAYERS=kernel``: ``hps.model._layer_kernels_cuda``, launched by
``_layers._launch_layer``) on Numba's CUDA simulator give CuPy's operations' bits, which NumPy's share:
``y += b`` then ``maximum(y, 0)``, and ``dy *= act > 0`` -- NaN, infinities and signed zeros included."""

import numpy as np
import pytest

from hps.model._layers import _launch_layer

SPECIAL = [np.nan, np.inf, -np.inf, -0.0, 0.0, -1e-30, 1e-30]


def _arrays(rng, dtype, n=37, m=11):
    y = rng.standard_normal((n, m)).astype(dtype)
    y.flat[:len(SPECIAL)] = SPECIAL
    b = rng.standard_normal(m).astype(dtype)
    b[0] = -0.0
    return y, b


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("relu", [True, False])
def test_bias_and_relu_in_one_launch_give_the_operations_bits(dtype, relu):
    y, b = _arrays(np.random.default_rng(1), dtype)
    want = y.copy()
    want += b
    if relu:
        np.maximum(want, 0, out=want)
    _launch_layer("bias_act", y, b, relu, y.dtype.type(0))
    np.testing.assert_array_equal(y.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_relu_mask_in_one_launch_gives_the_operations_bits(dtype):
    rng = np.random.default_rng(2)
    act, _ = _arrays(rng, dtype)
    dy, _ = _arrays(rng, dtype)
    dy[:, 3] = act[:, 3] = np.array(SPECIAL * 6, dtype)[:act.shape[0]]
    want = dy.copy()
    with np.errstate(invalid="ignore"):   # inf * 0 is NaN, in NumPy as in the kernel
        want *= act > 0
        _launch_layer("relu_mask", act, dy)
    np.testing.assert_array_equal(dy.view(np.uint8), want.view(np.uint8))


def test_nothing_to_do_launches_nothing():
    _launch_layer("bias_act", np.zeros((0, 4), np.float32), np.zeros(4, np.float32), True, np.float32(0))
