"""Row optimizers (SGD, Adagrad) and dense optimizers (SGD, Adam) against closed-form steps."""

import numpy as np
import pytest

from hps import InvalidInputError
from hps.model import (DenseAdam, DenseSGD, ModelConfig, SparseAdagrad, SparseSGD, make_dense_optimizer,
                       make_optimizers, make_sparse_optimizer)
from tests.reference import model as ref


def test_sparse_sgd_single_step():
    opt = SparseSGD(0.1)
    assert opt.state_width(4) == 0 and opt.row_width(4) == 4
    rows = np.array([[1.0, 2.0, 3.0, 4.0]])
    g = np.array([[1.0, -1.0, 0.5, 0.0]])
    np.testing.assert_allclose(opt.apply(rows, g), [[0.9, 2.1, 2.95, 4.0]])
    np.testing.assert_array_equal(rows, [[1.0, 2.0, 3.0, 4.0]])  # input untouched


@pytest.mark.parametrize("init_acc", [0.0, 0.1])
def test_sparse_adagrad_steps_match_closed_form(init_acc):
    rng = np.random.default_rng(0)
    d = 5
    opt = SparseAdagrad(0.05, initial_accumulator=init_acc, eps=1e-10)
    assert opt.state_width(d) == d and opt.row_width(d) == 2 * d
    emb = rng.normal(size=(7, d))
    rows = opt.init_rows(emb)
    np.testing.assert_array_equal(rows[:, d:], init_acc)
    w, acc = emb, np.full_like(emb, init_acc)
    for _ in range(3):
        g = rng.normal(size=(7, d))
        rows = opt.apply(rows, g)
        w, acc = ref.adagrad_step(w, acc, g, 0.05, 1e-10)
        np.testing.assert_allclose(rows[:, :d], w, rtol=1e-12)
        np.testing.assert_allclose(rows[:, d:], acc, rtol=1e-12)


def test_adagrad_first_step_from_zero_accumulator_is_lr_sign():
    opt = SparseAdagrad(0.5)
    rows = opt.apply(opt.init_rows(np.zeros((1, 3), np.float32)), np.array([[2.0, -3.0, 0.0]], np.float32))
    assert rows.dtype == np.float32
    np.testing.assert_allclose(rows[0, :3], [-0.5, 0.5, 0.0], rtol=1e-6)
    np.testing.assert_allclose(rows[0, 3:], [4.0, 9.0, 0.0])


def test_extra_row_columns_are_carried_unchanged():
    opt = SparseAdagrad(0.1)
    rows = np.concatenate([opt.init_rows(np.ones((2, 2))), [[7.0], [8.0]]], axis=1)
    out = opt.apply(rows, np.ones((2, 2)))
    np.testing.assert_array_equal(out[:, 4], [7.0, 8.0])
    with pytest.raises(InvalidInputError):
        opt.apply(rows[:, :3], np.ones((2, 2)))


def test_dense_sgd():
    p = {"W": np.array([[1.0, 2.0]]), "b": np.array([0.5])}
    DenseSGD(0.1).step(p, {"W": np.array([[1.0, 1.0]]), "b": np.array([-1.0])})
    np.testing.assert_allclose(p["W"], [[0.9, 1.9]])
    np.testing.assert_allclose(p["b"], [0.6])


def test_dense_adam_matches_closed_form_and_updates_in_place():
    rng = np.random.default_rng(1)
    p0 = rng.normal(size=(3, 4))
    params = {"W": p0.copy()}
    alias = params["W"]
    opt = DenseAdam(0.01, betas=(0.8, 0.99), eps=1e-6)
    gs = [rng.normal(size=(3, 4)) for _ in range(4)]
    for g in gs:
        opt.step(params, {"W": g})
    assert params["W"] is alias
    p, m, v = ref.adam_steps(p0, gs, 0.01, 0.8, 0.99, 1e-6)
    np.testing.assert_allclose(params["W"], p, rtol=1e-12)
    st = opt.state_dict()
    assert st["step"] == 4 and st["name"] == "adam"
    np.testing.assert_allclose(st["m"]["W"], m, rtol=1e-12)
    np.testing.assert_allclose(st["v"]["W"], v, rtol=1e-12)


def test_dense_adam_state_dict_resume_is_exact():
    rng = np.random.default_rng(2)
    gs = [{"W": rng.normal(size=(2, 2)), "b": rng.normal(size=2)} for _ in range(6)]
    start = {"W": rng.normal(size=(2, 2)), "b": rng.normal(size=2)}
    a = {k: v.copy() for k, v in start.items()}
    opt_a = DenseAdam(0.01)
    for g in gs:
        opt_a.step(a, g)
    b = {k: v.copy() for k, v in start.items()}
    opt_b = DenseAdam(0.01)
    for g in gs[:3]:
        opt_b.step(b, g)
    ckpt = opt_b.state_dict()
    opt_c = DenseAdam(0.5)  # hyperparameters come from the checkpoint
    opt_c.load_state_dict(ckpt)
    for g in gs[3:]:
        opt_c.step(b, g)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    with pytest.raises(InvalidInputError):
        DenseSGD(0.1).load_state_dict(ckpt)


def test_factories_and_config():
    assert isinstance(make_sparse_optimizer("adagrad", 0.1), SparseAdagrad)
    assert isinstance(make_sparse_optimizer("sgd", 0.1), SparseSGD)
    assert isinstance(make_dense_optimizer("adam", 0.1, betas=(0.5, 0.6)), DenseAdam)
    assert isinstance(make_dense_optimizer("sgd", 0.1), DenseSGD)
    for bad in (lambda: make_sparse_optimizer("ftrl", 0.1), lambda: make_dense_optimizer("adam", -1.0),
                lambda: make_dense_optimizer("rmsprop", 0.1)):
        with pytest.raises(InvalidInputError):
            bad()
    s, d = make_optimizers(ModelConfig(n_fields=2, sparse_lr=0.2, adagrad_initial_accumulator=0.1))
    assert (s.lr, s.initial_accumulator, d.lr) == (0.2, 0.1, 1e-3)
