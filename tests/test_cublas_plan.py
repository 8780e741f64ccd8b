"""``hps._cublas.gemm_plan``: the arguments of cuBLAS's column-major ``gemm`` for a row-major product
``c = a @ b`` of arrays as they lie in memory. Checked without a GPU: each plan runs through a NumPy model
of what ``gemm`` reads and writes (the raw buffers from each array's first element, column-major with the
plan's leading dimensions and transpose flags) and must give ``a @ b``; layouts cuBLAS cannot read in
place get no plan. The GPU half (cuBLAS itself against ``cupy.matmul``) is tests/gpu/test_cublas_gpu.py."""

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

from hps import _cublas
from hps.errors import InvalidInputError


def _stored(x, rows: int, cols: int, ld: int, writeable: bool = False):
    """The (rows, cols) column-major matrix with leading dimension ``ld`` whose first element is x's
    (cuBLAS's rule: ``ld`` at least the rows)."""
    assert ld >= max(1, rows)
    isz = x.dtype.itemsize
    return as_strided(x, shape=(rows, cols), strides=(isz, ld * isz), writeable=writeable)


def _gemm_model(plan, a, b, out) -> None:
    """What cuBLAS computes for ``plan`` (``_cublas.matmul`` passes b's buffer as A and a's as B)."""
    t = _cublas.OP_T
    A = _stored(b, plan.k, plan.m, plan.lda) if plan.transa == t else _stored(b, plan.m, plan.k, plan.lda)
    B = _stored(a, plan.n, plan.k, plan.ldb) if plan.transb == t else _stored(a, plan.k, plan.n, plan.ldb)
    opa, opb = (A.T if plan.transa == t else A), (B.T if plan.transb == t else B)
    _stored(out, plan.m, plan.n, plan.ldc, writeable=True)[...] = opa @ opb


def _layouts(rng, rows: int, cols: int):
    """The same (rows, cols) values laid out as hps's products meet them: C-contiguous, the transpose of a
    C-contiguous array, a column slice of a wider array, every other row of a taller one, the transpose
    of a column slice (a column-major operand with a leading dimension past its rows)."""
    v = rng.standard_normal((rows, cols))
    wide = np.zeros((rows, cols + 5))
    wide[:, 2:cols + 2] = v
    tall = np.zeros((2 * rows, cols))
    tall[::2] = v
    twide = np.zeros((cols, rows + 3))
    twide[:, 1:rows + 1] = v.T
    return {"C": v.copy(), "T": np.ascontiguousarray(v.T).T, "cols": wide[:, 2:cols + 2], "rows": tall[::2],
            "T-cols": twide[:, 1:rows + 1].T}


@pytest.mark.parametrize("m,k,n", [(5, 3, 4), (1, 6, 2), (7, 1, 3), (4, 5, 1), (1, 1, 1), (64, 33, 17)])
def test_every_plan_computes_the_product_in_the_buffers_as_they_lie(m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    for an, a in _layouts(rng, m, k).items():
        for bn, b in _layouts(rng, k, n).items():
            for on in ("C", "cols"):
                out = np.full((m, n), np.nan) if on == "C" else np.full((m, n + 4), np.nan)[:, 3:n + 3]
                plan = _cublas._plan_of(a, b, out)
                assert plan is not None, (an, bn, on)
                _gemm_model(plan, a, b, out)
                np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12, err_msg=f"{an} @ {bn} -> {on}")


def test_layouts_cublas_cannot_read_in_place_get_no_plan():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 4)), rng.standard_normal((4, 5))
    out = np.empty((6, 5))
    assert _cublas._plan_of(a[::-1], b, out) is None                       # a negative stride
    assert _cublas._plan_of(rng.standard_normal((12, 8))[::2, ::2], b, out) is None   # neither way contiguous
    assert _cublas._plan_of(a, b, np.empty((5, 6)).T) is None              # a column-major output
    assert _cublas._plan_of(a, b, np.empty((6, 4))) is None                # the wrong output shape
    assert _cublas._plan_of(a[:, :0], b[:0], np.empty((6, 5))) is None     # k = 0: nothing for cuBLAS
    assert _cublas._plan_of(a.astype(np.float32), b, out) is None          # mixed dtypes
    assert _cublas._plan_of(a.astype(np.int64), b.astype(np.int64), out.astype(np.int64)) is None
    assert _cublas._plan_of(a, a.T @ a, a) is None                         # the output is an operand
    misaligned = np.zeros(6 * 4 * 8 + 4, np.uint8)[4:].view(np.float64).reshape(6, 4)
    assert misaligned.strides == (32, 8) and _cublas._plan_of(misaligned, b, out) is None
    assert _cublas._plan_of(misaligned.copy(), b, out) is not None


def test_leading_dimensions_past_int32_get_no_plan():
    big = 2 ** 31
    assert _cublas.gemm_plan((2, 3), (big, 1), (3, 4), (4, 1), (2, 4), (4, 1)) is None
    assert _cublas.gemm_plan((2, 3), (3, 1), (3, 4), (4, 1), (2, 4), (4, 1)) == _cublas.GemmPlan(
        _cublas.OP_N, _cublas.OP_N, 4, 2, 3, 4, 3, 4)


def test_modes(monkeypatch):
    monkeypatch.setattr(_cublas._MODE, "_mode", None)
    monkeypatch.setenv("HPS_CUDA_GEMM", "cublas-gil")
    assert _cublas.mode() == "cublas-gil"
    with pytest.raises(InvalidInputError, match="HPS_CUDA_GEMM / product mode must be one of cupy, cublas-gil"):
        _cublas.set_mode("cublas-nogil")
    monkeypatch.setattr(_cublas._MODE, "_mode", None)
    monkeypatch.delenv("HPS_CUDA_GEMM")
    assert _cublas.mode() == "cupy"


@pytest.fixture
def fake_cupy(monkeypatch):
    """``cupy`` standing in as NumPy (its ``matmul`` is the fallback ``_cublas.matmul`` calls), the mode
    and check state restored after the test."""
    import sys
    import types

    fake = types.SimpleNamespace(matmul=lambda a, b, out: np.matmul(a, b, out=out))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(_cublas._MODE, "_mode", _cublas.mode())
    monkeypatch.setitem(_cublas._state, "checked", _cublas._state["checked"])


def test_a_product_takes_cublas_where_it_has_a_plan_and_cupy_elsewhere(fake_cupy, monkeypatch):
    gemms = []
    monkeypatch.setattr(_cublas, "_lib", lambda hold_gil: f"lib-{hold_gil}")
    monkeypatch.setattr(_cublas, "_gemm", lambda lib, a, b, out, plan: gemms.append((lib, plan)))
    _cublas.set_mode("cublas-gil")
    _cublas._state["checked"] = True
    a, b = np.ones((4, 3)), np.ones((3, 2))
    out = np.empty((4, 2))
    assert _cublas.matmul(a, b, out) is out and gemms == [("lib-True", _cublas._plan_of(a, b, out))]
    _cublas.matmul(a[::-1], b, out)   # no plan: CuPy's matmul
    assert len(gemms) == 1 and (out == 3).all()
    _cublas.set_mode("cupy")
    _cublas.matmul(a, b, out)
    assert len(gemms) == 1


def test_a_failed_probe_warns_once_and_leaves_the_products_to_cupy(fake_cupy, monkeypatch):
    probes = []
    monkeypatch.setattr(_cublas, "probe", lambda hold_gil: probes.append(hold_gil) or "x.T @ x differs")
    monkeypatch.setattr(_cublas, "_gemm", lambda *a: pytest.fail("cuBLAS after a failed probe"))
    _cublas.set_mode("cublas")
    _cublas._state["checked"] = False
    a, b, out = np.ones((2, 3)), np.ones((3, 2)), np.empty((2, 2))
    with pytest.warns(RuntimeWarning, match="x.T @ x differs.*through CuPy"):
        _cublas.matmul(a, b, out)
    _cublas.matmul(a, b, out)
    assert probes == [False] and _cublas.mode() == "cupy" and (out == 3).all()


def test_a_failed_cublas_call_raises_a_typed_error_naming_it():
    _cublas._check_status(0, "cublasSgemm_v2")   # success: nothing
    with pytest.raises(_cublas.CublasError, match="cublasSgemm_v2 failed with cuBLAS status 13.*HPS_CUDA_GEMM=cupy"):
        _cublas._check_status(13, "cublasSgemm_v2")
