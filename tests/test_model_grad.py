"""CTRModel forward/backward: reference loss, finite-difference gradients (float64), shares of a
global mini-batch summing to the full-batch gradient (lossless multi-process), corners."""

import numpy as np
import pytest

from hps import InvalidInputError
from hps.data import Batch
from hps.model import CTRModel, ModelConfig
from tests.reference import model as ref

F, D, ND = 3, 4, 2


def _setup(seed=0, n=12, hidden=(6, 5), dtype=np.float64):
    rng = np.random.default_rng(seed)
    b = ref.random_batch(rng, n, F, n_dense=ND, max_keys=3, vocab=4)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    emb = rng.normal(scale=0.5, size=(uniq.shape[0], D)).astype(dtype)
    m = CTRModel(F, D, ND, hidden=hidden, seed=seed, dtype=dtype)
    for k in m.params:  # non-zero biases so their gradient paths are exercised
        if k.startswith("b"):
            m.params[k][:] = rng.normal(scale=0.1, size=m.params[k].shape)
    return m, b, uniq, inv, emb


@pytest.mark.parametrize("hidden", [(6, 5), (7,), ()])
def test_loss_and_probs_match_reference(hidden):
    m, b, _, inv, emb = _setup(hidden=hidden)
    loss, probs, _, _ = m.forward_backward(emb, inv, b)
    rloss, rprobs = ref.forward(m.params, emb, inv, b, F)
    assert loss == pytest.approx(rloss, rel=1e-12)
    np.testing.assert_allclose(probs, rprobs, rtol=1e-12)
    np.testing.assert_allclose(m.predict(emb, inv, b), rprobs, rtol=1e-12)


@pytest.mark.parametrize("hidden", [(6, 5), ()])
def test_gradients_match_finite_differences(hidden):
    m, b, _, inv, emb = _setup(seed=1, hidden=hidden)
    _, _, g_emb, g_dense = m.forward_backward(emb, inv, b)

    def f():
        return ref.forward(m.params, emb, inv, b, F)[0]

    np.testing.assert_allclose(g_emb, ref.numerical_grad(f, emb), rtol=1e-5, atol=1e-8)
    assert set(g_dense) == set(m.params)
    for k, p in m.params.items():
        assert g_dense[k].shape == p.shape
        np.testing.assert_allclose(g_dense[k], ref.numerical_grad(f, p), rtol=1e-5, atol=1e-8, err_msg=k)


@pytest.mark.parametrize("shares", [2, 4])
def test_shares_with_n_total_sum_to_full_batch(shares):
    """Rank r holds examples [cut[r], cut[r+1]); each computes gradients of its own unique keys with
    n_total = global n; summed per key they equal the single-process gradient (lossless BSP)."""
    m, b, uniq, inv, emb = _setup(seed=2, n=23)
    loss, _, g_emb, g_dense = m.forward_backward(emb, inv, b)
    cuts = np.linspace(0, len(b), shares + 1).astype(int)
    cuts[1] = 0 if shares == 4 else cuts[1]  # an empty share too
    assert_shares_sum_to_whole(m, b, uniq, emb, cuts, (loss, g_emb, g_dense))


def assert_shares_sum_to_whole(m, b, uniq, rows, cuts, whole):
    """Shares [cuts[r], cuts[r+1]) of batch ``b``, each with its own unique keys and n_total = len(b):
    their losses, per-key row gradients and dense gradients sum to ``whole`` = (loss, row gradients of
    ``uniq``, dense gradients) of the full batch."""
    loss, g_rows, g_dense = whole
    tot_loss, tot_rows = 0.0, np.zeros_like(g_rows)
    tot_dense = {k: np.zeros_like(v) for k, v in g_dense.items()}
    for r in range(len(cuts) - 1):
        part = b.slice(cuts[r], cuts[r + 1])
        pu, pinv = np.unique(part.keys, return_inverse=True)
        at = np.searchsorted(uniq, pu)
        l, _, gr, gd = m.forward_backward(rows[at], pinv, part, n_total=len(b))
        tot_loss += l
        np.add.at(tot_rows, at, gr)
        for k in gd:
            tot_dense[k] += gd[k]
    assert tot_loss == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(tot_rows, g_rows, rtol=1e-6, atol=1e-12)
    for k in g_dense:
        np.testing.assert_allclose(tot_dense[k], g_dense[k], rtol=1e-6, atol=1e-12, err_msg=k)


def test_float32_close_to_float64():
    m64, b, _, inv, emb = _setup(seed=4)
    m32 = CTRModel(F, D, ND, hidden=(6, 5), seed=4, dtype=np.float32)
    m32.load_state_dict(m64.state_dict())
    a, c = m64.forward_backward(emb, inv, b), m32.forward_backward(emb.astype(np.float32), inv, b)
    assert c[2].dtype == np.float32 and all(v.dtype == np.float32 for v in c[3].values())
    assert a[0] == pytest.approx(c[0], rel=1e-5)
    np.testing.assert_allclose(c[2], a[2], rtol=1e-3, atol=1e-6)


def test_extreme_logits_stay_finite():
    m, b, _, inv, emb = _setup(seed=5)
    m.params["b2"][:] = 1e4 * np.sign(np.random.default_rng(0).normal())
    loss, probs, g_emb, g = m.forward_backward(emb, inv, b)
    assert np.isfinite(loss) and np.isfinite(probs).all() and np.isfinite(g_emb).all()
    assert all(np.isfinite(v).all() for v in g.values())


def test_empty_batch():
    m = CTRModel(F, D, ND, hidden=(6,), seed=0)
    b = Batch(np.zeros(0, np.float32), np.zeros((0, ND), np.float32), np.zeros(0, np.uint64),
              np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(1, np.int64), F)
    loss, probs, g_emb, g = m.forward_backward(np.zeros((0, D), np.float32), np.zeros(0, np.int64), b,
                                               n_total=8)
    assert loss == 0.0 and probs.shape == (0,) and g_emb.shape == (0, D)
    assert all((v == 0).all() for v in g.values())


def test_init_is_deterministic_and_scaled():
    a, c = CTRModel(10, 8, 3, seed=11), CTRModel(10, 8, 3, seed=11)
    assert list(a.params) == ["W0", "b0", "W1", "b1", "W2", "b2"]
    assert a.params["W0"].shape == (83, 256) and a.params["W2"].shape == (128, 1)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], c.params[k])
    assert np.abs(a.params["W0"]).max() <= np.sqrt(6 / 83)
    assert np.abs(a.params["W2"]).max() <= np.sqrt(6 / 129)
    assert not np.array_equal(CTRModel(10, 8, 3, seed=12).params["W0"], a.params["W0"])


def test_state_dict_round_trip():
    m, b, _, inv, emb = _setup(seed=6)
    other = CTRModel(F, D, ND, hidden=(6, 5), seed=99, dtype=np.float64)
    other.load_state_dict(m.state_dict())
    assert other.forward_backward(emb, inv, b)[0] == m.forward_backward(emb, inv, b)[0]
    with pytest.raises(InvalidInputError):
        other.load_state_dict({"W0": np.zeros((1, 1))})


def test_bad_inputs_raise_typed_errors():
    m, b, _, inv, emb = _setup()
    with pytest.raises(InvalidInputError):
        m.forward_backward(emb[:, :2], inv, b)
    with pytest.raises(InvalidInputError):
        m.forward_backward(emb, inv[:-1], b)
    with pytest.raises(InvalidInputError):
        m.forward_backward(emb[:1], inv, b)  # inv points past the rows
    with pytest.raises(InvalidInputError):
        m.forward_backward(emb, inv, b, n_total=len(b) - 1)
    with pytest.raises(InvalidInputError):
        ModelConfig(n_fields=0)
    with pytest.raises(InvalidInputError):
        ModelConfig(n_fields=3, sparse_optimizer="ftrl")
