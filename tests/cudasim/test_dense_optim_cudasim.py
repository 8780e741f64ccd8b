"""The dense optimizers' CUDA kernels (``hps/model/_dense_kernels_cuda.py``, launched by
``_dense_optim.launch_dense``) on Numba's CUDA simulator: one launch steps a whole tensor as the host's
kernels do, over several blocks of a grid-stride loop, for float32 and float64: bit for bit here, where
the element function runs as the host compiled it (a GPU may fuse a multiply and an add: to rounding)."""

import numpy as np
import pytest

from hps import _launch
from hps.model import _dense_kernels as K
from hps.model._dense_optim import launch_dense

pytestmark = pytest.mark.cudasim


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_and_adagrad_launches_step_like_the_host_kernels(monkeypatch, dtype):
    monkeypatch.setattr(_launch, "BLOCK_SIZE", 8)       # 100 elements: several blocks and strides
    monkeypatch.setattr(_launch, "SIM_MAX_BLOCKS", 3)
    rng = np.random.default_rng(5)
    p, g, m, v = (rng.standard_normal(100).astype(dtype) for _ in range(4))
    v = np.abs(v)
    t = np.dtype(dtype).type
    hyper = (0.9, 0.1, 0.999, 0.001, 0.01 / (1 - 0.9 ** 3), np.sqrt(1 - 0.999 ** 3), 1e-8)

    host = [a.copy() for a in (p, g, m, v)]
    K.adam_flat(*host, *hyper)
    dev = [a.copy() for a in (p, g, m, v)]
    assert launch_dense("adam_dense", dev[0], dev[1:], tuple(t(h) for h in hyper), stream=0)
    for a, b in zip(host, dev):
        np.testing.assert_array_equal(b, a)
    assert not np.array_equal(dev[0], p)

    host = [p.copy(), g.copy(), v.copy()]
    K.adagrad_flat(*host, 0.05, 1e-10)
    dev = [p.copy(), g.copy(), v.copy()]
    assert launch_dense("adagrad_dense", dev[0], dev[1:], (t(0.05), t(1e-10)), stream=0)
    for a, b in zip(host, dev):
        np.testing.assert_array_equal(b, a)
