"""On a real GPU, ``hps._cublas`` multiplies through cuBLAS called with ctypes (``HPS_CUDA_GEMM``): its
probe passes in both GIL modes, the products of an MLP's pass (row-major, transposed, strided) take that
path and equal ``cupy.matmul``'s to rounding, and a ``--device cuda`` job with it ends as one with CuPy's
products. (tests/test_cublas_plan.py checks the plans without a GPU.)"""

import numpy as np
import pytest

from hps import _cublas as G

from .test_train_repeat_gpu import flat, run

pytestmark = pytest.mark.gpu


@pytest.fixture
def gemm_mode():
    before = G.mode()
    yield G.set_mode
    G.set_mode(before)


@pytest.mark.parametrize("hold_gil", [True, False], ids=["cublas-gil", "cublas"])
def test_probe_agrees_with_cupy(hold_gil):
    pytest.importorskip("cupy")
    assert G.probe(hold_gil) is None


@pytest.mark.parametrize("mode", ["cublas-gil", "cublas"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_mlp_pass_of_products_goes_through_cublas_and_equals_cupy(mode, dtype, gemm_mode, monkeypatch):
    cp = pytest.importorskip("cupy")
    gemm_mode(mode)
    calls = []
    real = G._gemm
    monkeypatch.setattr(G, "_gemm", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(5)
    x = cp.asarray(rng.standard_normal((4096, 845)), dtype=dtype)
    w = cp.asarray(rng.standard_normal((845, 512)), dtype=dtype)
    dy = cp.asarray(rng.standard_normal((4096, 512)), dtype=dtype)
    for name, a, b in [("x @ W", x, w), ("x.T @ dy", x.T, dy), ("dy @ W[:429].T", dy, w[:429].T)]:
        out = cp.empty((a.shape[0], b.shape[1]), dtype)
        assert G.matmul(a, b, out) is out
        want = cp.matmul(a, b)
        tol = 1e-4 if dtype == np.float32 else 1e-10
        assert float(cp.abs(out - want).max()) <= tol * float(cp.abs(want).max()), name
    assert len(calls) == 3


def test_a_cuda_job_with_cublas_products_ends_as_with_cupy(tmp_path, gemm_mode, monkeypatch):
    pytest.importorskip("cupy")
    calls = []
    real = G._gemm
    monkeypatch.setattr(G, "_gemm", lambda *a: calls.append(1) or real(*a))
    gemm_mode("cupy")
    k0, v0, d0 = flat(run(tmp_path, "cupy", "cuda", ["--sparse-optimizer", "adagrad"])[0])
    assert not calls
    gemm_mode("cublas-gil")
    k1, v1, d1 = flat(run(tmp_path, "cublas", "cuda", ["--sparse-optimizer", "adagrad"])[0])
    assert calls, "no product went through cuBLAS"
    np.testing.assert_array_equal(k1, k0)
    np.testing.assert_allclose(v1, v0, atol=1e-5)
    for name in d0:
        np.testing.assert_allclose(d1[name], d0[name], atol=1e-5, err_msg=name)
