"""Every layer's forward against the naive reference and its backward against finite differences
(float64): the gradient of ``sum(out * R)`` for a random R, w.r.t. every input and parameter."""

import numpy as np
import pytest

from hps.model import _layers as L
from tests.reference import model as ref

RTOL, ATOL = 1e-6, 1e-9


def _check_grad(f, x, analytic, name=""):
    np.testing.assert_allclose(analytic, ref.numerical_grad(f, x), rtol=RTOL, atol=ATOL, err_msg=name)


def _params(layer_init, rng):
    """Layer parameters with non-zero biases, so every gradient path is exercised."""
    p = layer_init(rng)
    return {k: (v if k.split("_")[-1].startswith("W") else rng.normal(scale=0.3, size=v.shape))
            for k, v in p.items()}


@pytest.mark.parametrize("relu_last", [False, True])
@pytest.mark.parametrize("widths", [(5, 4, 3, 2), (5, 1), (5,)])
def test_mlp_forward_and_gradients(widths, relu_last):
    rng = np.random.default_rng(0)
    mlp = L.MLP(widths, prefix="m_", relu_last=relu_last)
    p = _params(mlp.init, rng)
    x = rng.normal(size=(7, widths[0]))
    R = rng.normal(size=(7, widths[-1]))
    y, acts = mlp.forward(np, p, x)
    for e in range(7):
        np.testing.assert_allclose(y[e], ref.mlp(p, x[e], prefix="m_", relu_last=relu_last), rtol=1e-12)
    grads = {}
    dx = mlp.backward(p, acts, R, grads)

    def f():
        return float((mlp.forward(np, p, x)[0] * R).sum())

    _check_grad(f, x, dx, "x")
    assert set(grads) == set(p)
    for k in p:
        _check_grad(f, p[k], grads[k], k)
    # only the first columns of dx, or none
    np.testing.assert_allclose(mlp.backward(p, acts, R, {}, dx_cols=2), dx[:, :2], rtol=1e-12)
    assert mlp.backward(p, acts, R, {}, dx_cols=0) is None


def test_mlp_init_he_and_xavier_bounds():
    rng = np.random.default_rng(1)
    p = L.MLP((400, 300, 1)).init(rng)
    assert np.abs(p["W0"]).max() <= np.sqrt(6 / 400) and np.abs(p["W0"]).max() > 0.9 * np.sqrt(6 / 400)
    assert np.abs(p["W1"]).max() <= np.sqrt(6 / 301)
    assert not p["b0"].any() and list(p) == ["W0", "b0", "W1", "b1"]
    q = L.MLP((400, 300), relu_last=True).init(np.random.default_rng(1))
    np.testing.assert_array_equal(q["W0"], p["W0"])  # same draws, same order


@pytest.mark.parametrize("n_layers", [1, 3])
def test_cross_net_forward_and_gradients(n_layers):
    rng = np.random.default_rng(2)
    net = L.CrossNet(4, n_layers)
    p = _params(net.init, rng)
    x0 = rng.normal(size=(6, 4))
    R = rng.normal(size=(6, 4))
    y, ctx = net.forward(np, p, x0)
    for e in range(6):
        np.testing.assert_allclose(y[e], ref.cross_net(p, x0[e]), rtol=1e-12)
    grads = {}
    dx0 = net.backward(np, p, ctx, R, grads)

    def f():
        return float((net.forward(np, p, x0)[0] * R).sum())

    _check_grad(f, x0, dx0, "x0")
    for k in p:
        _check_grad(f, p[k], grads[k], k)


def test_fm_forward_and_gradients():
    rng = np.random.default_rng(3)
    e = rng.normal(size=(5, 4, 3))
    R = rng.normal(size=5)
    y, s = L.fm(np, e)
    np.testing.assert_allclose(y, [ref.fm_pairs(e[i]) for i in range(5)], rtol=1e-12)
    _check_grad(lambda: float((L.fm(np, e)[0] * R).sum()), e, L.fm_backward(e, s, R))


@pytest.mark.parametrize("m", [2, 5])
def test_dot_interaction_forward_and_gradients(m):
    rng = np.random.default_rng(4)
    layer = L.DotInteraction(m)
    t = rng.normal(size=(3, m, 4))
    R = rng.normal(size=(3, layer.out_dim))
    y, _ = layer.forward(np, t)
    assert y.shape == (3, m * (m - 1) // 2)
    np.testing.assert_allclose(y, [ref.dot_pairs(t[i]) for i in range(3)], rtol=1e-12)
    _check_grad(lambda: float((layer.forward(np, t)[0] * R).sum()), t, layer.backward(np, t, R))


@pytest.mark.parametrize("use_kernels", [True, False])
def test_pool_forward_and_gradients(use_kernels):
    """Pooling of (u, P) rows, both the Numba kernels and the gather + scatter-add path."""
    rng = np.random.default_rng(5)
    b = ref.random_batch(rng, 9, 3, max_keys=3, vocab=4)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    rows = rng.normal(size=(uniq.shape[0], 5))
    args = (inv.astype(np.int64), b.field, b.weights.astype(np.float64), b.offsets)
    out = L.pool(np, rows, *args, len(b), 3, use_kernels)
    np.testing.assert_allclose(out, ref.pool(rows, inv, b, 3), rtol=1e-12, atol=1e-15)
    R = rng.normal(size=out.shape)
    d = L.pool_backward(np, R, rows.shape[0], *args, 3, use_kernels)
    _check_grad(lambda: float((L.pool(np, rows, *args, len(b), 3, use_kernels) * R).sum()), rows, d)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("d", [1, 8, 37])
def test_pool_kernels_add_in_csr_order_bit_for_bit(dtype, d):
    """The Numba kernels (vectorised over a row's columns) add each column's occurrences in CSR order:
    the bits of a loop over the occurrences in that order, in the rows' dtype (several keys of one
    field in an example, weights not 1, a row view of wider rows as the model passes)."""
    rng = np.random.default_rng(d)
    n, F, u = 40, 3, 17
    counts = rng.integers(0, 6, n)
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    nnz = int(off[-1])
    inv, f = rng.integers(0, u, nnz).astype(np.int64), rng.integers(0, F, nnz).astype(np.int32)
    w = rng.normal(size=nnz).astype(dtype)
    rows = rng.normal(size=(u, d + 3)).astype(dtype)[:, :d]
    want = np.zeros((n, F * d), dtype)
    for e in range(n):
        for k in range(off[e], off[e + 1]):
            want[e, f[k] * d:(f[k] + 1) * d] += w[k] * rows[inv[k]]
    got = L.pool(np, np.ascontiguousarray(rows), inv, f, w, off, n, F, True)
    assert got.tobytes() == want.tobytes()
    g = rng.normal(size=(n, F * d)).astype(dtype)
    want_b = np.zeros((u, d), dtype)
    for e in range(n):
        for k in range(off[e], off[e + 1]):
            want_b[inv[k]] += w[k] * g[e, f[k] * d:(f[k] + 1) * d]
    assert L.pool_backward(np, g, u, inv, f, w, off, F, True).tobytes() == want_b.tobytes()


def test_linear_backward_only_first_input_columns():
    rng = np.random.default_rng(6)
    lin = L.Linear("W", "b", 4, 2)
    p = lin.init(rng)
    x, dy = rng.normal(size=(3, 4)), rng.normal(size=(3, 2))
    full = lin.backward(p, x, dy, {})
    np.testing.assert_allclose(lin.backward(p, x, dy, {}, dx_cols=3), full[:, :3], rtol=1e-12)
