"""On a real GPU, a model's pooled pass replayed as CUDA graphs (``hps/model/_graphs.py``, the products
through hps's cuBLAS handle: ``HPS_CUDA_GEMM=cublas-gil``) gives the eager pass's bits with the same
products, for every model, across parameter updates made in place between calls (the graphs read the
parameters where they are) and for a second shape (an epoch's last, shorter mini-batch)."""

import numpy as np
import pytest

from hps import _cublas
from hps.model import MODELS

pytestmark = pytest.mark.gpu


def _batches(rng, cp, n, width, n_dense, count):
    for _ in range(count):
        yield (cp.asarray(rng.standard_normal((n, width)).astype(np.float32)),
               cp.asarray(rng.standard_normal((n, n_dense)).astype(np.float32)),
               cp.asarray((rng.random(n) < 0.3).astype(np.float32)))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_graphed_pass_has_the_eager_bits(name, monkeypatch):
    cp = pytest.importorskip("cupy")
    monkeypatch.setattr(_cublas._MODE, "_mode", "cublas-gil")
    F, d, n_dense = 5, 8, 3
    models = {}
    for graphs in ("1", "0"):
        monkeypatch.setenv("HPS_CUDA_GRAPHS", graphs)
        models[graphs] = MODELS[name](F, d, n_dense=n_dense, hidden=(32, 16), seed=3, xp=cp)
    assert models["0"]._graphs is None and models["1"]._graphs is not None
    width = F * models["1"].row_params
    out = {}
    for graphs, m in models.items():
        rng, got = np.random.default_rng(9), []
        for n in (64, 64, 64, 64, 40, 40, 40, 64):
            for pooled, dense, y in _batches(rng, cp, n, width, n_dense, 1):
                def loss_grad(z, y=y, n=n):
                    return (1 / (1 + cp.exp(-z)) - y) / n
                d_pooled, grads = m.forward_backward_pooled(pooled, dense, loss_grad)
                got.append((cp.asnumpy(d_pooled), {k: cp.asnumpy(v) for k, v in grads.items()}))
                for k, v in m.params.items():   # an optimizer's step: in place
                    v -= 0.05 * grads[k]
        out[graphs] = (got, {k: cp.asnumpy(v) for k, v in m.params.items()})
    assert set(models["1"]._graphs.graphs) == {((64, width), (64, n_dense)), ((40, width), (40, n_dense))}
    assert not models["1"]._graphs.off
    for (dg, gg), (de, ge) in zip(out["1"][0], out["0"][0]):
        np.testing.assert_array_equal(dg, de)
        for k in ge:
            np.testing.assert_array_equal(gg[k], ge[k])
    for k, v in out["0"][1].items():
        np.testing.assert_array_equal(out["1"][1][k], v)
