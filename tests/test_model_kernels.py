"""Pooling kernels and key-seeded init against the by-the-book reference (tests/reference/model.py)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hps.data import Batch
from hps.model import CTRModel, init_embeddings
from hps.model import _kernels
from tests.reference import model as ref


def _pool_fast(emb, inv, b):
    out = np.zeros((len(b), b.n_fields * emb.shape[1]))
    _kernels.pool_fields(emb, inv.astype(np.int64), b.field, b.weights, b.offsets, out)
    return out


def _pool_back_fast(g, inv, b, u, d):
    out = np.zeros((u, d))
    _kernels.pool_fields_backward(g, inv.astype(np.int64), b.field, b.weights, b.offsets, out)
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 9), n_fields=st.integers(1, 4),
       d=st.integers(1, 5), weighted=st.booleans())
def test_pool_matches_reference(seed, n, n_fields, d, weighted):
    rng = np.random.default_rng(seed)
    b = ref.random_batch(rng, n, n_fields, max_keys=3, vocab=4, weighted=weighted)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    emb = rng.normal(size=(uniq.shape[0], d))
    np.testing.assert_allclose(_pool_fast(emb, inv, b), ref.pool(emb, inv, b, n_fields),
                               rtol=1e-12, atol=1e-12)
    g = rng.normal(size=(n, n_fields * d))
    np.testing.assert_allclose(_pool_back_fast(g, inv, b, uniq.shape[0], d),
                               ref.pool_backward(g, inv, b, uniq.shape[0], d), rtol=1e-12, atol=1e-12)


def test_pool_backward_is_transpose():
    """<pool(E), G> == <E, pool_backward(G)> for the multi-hot, weighted, duplicate-key case."""
    rng = np.random.default_rng(3)
    b = ref.random_batch(rng, 20, 3, max_keys=4, vocab=3)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    emb = rng.normal(size=(uniq.shape[0], 4))
    g = rng.normal(size=(20, 12))
    lhs = (_pool_fast(emb, inv, b) * g).sum()
    rhs = (emb * _pool_back_fast(g, inv, b, uniq.shape[0], 4)).sum()
    assert lhs == pytest.approx(rhs, rel=1e-12)


def test_empty_fields_and_examples_pool_to_zero():
    # example 0: field 1 only (twice the same key, weights 2 and 3); example 1: no keys at all.
    keys = np.array([5, 5], dtype=np.uint64)
    b = Batch(np.zeros(2, np.float32), np.zeros((2, 0), np.float32), keys, np.array([1, 1], np.int32),
              np.array([2.0, 3.0], np.float32), np.array([0, 2, 2], np.int64), 3)
    emb = np.array([[1.0, -1.0]])
    out = _pool_fast(emb, np.array([0, 0]), b)
    np.testing.assert_array_equal(out, [[0, 0, 5, -5, 0, 0], [0, 0, 0, 0, 0, 0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_generic_xp_path_matches_kernels(dtype):
    """The gather + scatter-add path (used for CuPy) run on NumPy gives the kernel path's results."""
    rng = np.random.default_rng(7)
    b = ref.random_batch(rng, 16, 3, n_dense=2, max_keys=3, vocab=5)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    emb = rng.normal(size=(uniq.shape[0], 4)).astype(dtype)
    fast = CTRModel(3, 4, 2, hidden=(6, 5), seed=1, dtype=dtype)
    generic = CTRModel(3, 4, 2, hidden=(6, 5), seed=1, dtype=dtype)
    generic.use_cpu_kernels = False
    a, c = fast.forward_backward(emb, inv, b), generic.forward_backward(emb, inv, b)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert a[0] == pytest.approx(c[0], rel=tol)
    np.testing.assert_allclose(a[1], c[1], rtol=tol, atol=tol)
    np.testing.assert_allclose(a[2], c[2], rtol=tol, atol=tol)
    for k in a[3]:
        np.testing.assert_allclose(a[3][k], c[3][k], rtol=tol, atol=tol)


def test_init_embeddings_depends_only_on_key_and_seed():
    keys = np.arange(1, 1001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    full = init_embeddings(keys, 8, seed=3, scale=0.05)
    perm = np.random.default_rng(0).permutation(1000)
    np.testing.assert_array_equal(init_embeddings(keys[perm], 8, seed=3, scale=0.05), full[perm])
    np.testing.assert_array_equal(init_embeddings(keys[:10], 8, seed=3, scale=0.05), full[:10])
    assert np.abs(full).max() <= 0.05 and abs(full.mean()) < 0.002 and full.std() > 0.025
    assert not np.array_equal(init_embeddings(keys, 8, seed=4, scale=0.05), full)
    assert init_embeddings(np.empty(0, np.uint64), 8).shape == (0, 8)


@pytest.mark.gpu
def test_cupy_path_matches_numpy():
    """CuPy (gather + cupyx.scatter_add) gives the NumPy kernel path's loss and gradients."""
    cupy = pytest.importorskip("cupy")
    from hps.model import SparseAdagrad

    rng = np.random.default_rng(11)
    b = ref.random_batch(rng, 33, 3, n_dense=2, max_keys=3, vocab=5)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    emb = rng.normal(size=(uniq.shape[0], 4))
    host = CTRModel(3, 4, 2, hidden=(6, 5), seed=1, dtype=np.float64)
    dev = CTRModel(3, 4, 2, hidden=(6, 5), seed=1, dtype=np.float64, xp=cupy)
    a = host.forward_backward(emb, inv, b)
    c = dev.forward_backward(cupy.asarray(emb), cupy.asarray(inv), b, n_total=40)
    assert isinstance(c[2], cupy.ndarray)
    assert a[0] * len(b) / 40 == pytest.approx(c[0], rel=1e-12)
    np.testing.assert_allclose(a[2] * len(b) / 40, cupy.asnumpy(c[2]), rtol=1e-10, atol=1e-14)
    for k in a[3]:
        np.testing.assert_allclose(a[3][k] * len(b) / 40, cupy.asnumpy(c[3][k]), rtol=1e-10, atol=1e-14)
    opt = SparseAdagrad(0.1)
    rows = opt.init_rows(emb)
    np.testing.assert_allclose(cupy.asnumpy(opt.apply(cupy.asarray(rows), c[2])),
                               opt.apply(rows, cupy.asnumpy(c[2])), rtol=1e-12)
