"""Row optimizers (SGD, Adagrad, row-wise Adagrad, Adam) and dense optimizers (SGD, Adagrad, Adam)
against closed-form steps; the Numba kernels against the vectorised path."""

import numpy as np
import pytest

from hps import InvalidInputError
from hps.model import (DenseAdagrad, DenseAdam, DenseSGD, ModelConfig, SparseAdagrad, SparseAdam,
                       SparseRowwiseAdagrad, SparseSGD, make_dense_optimizer, make_optimizers,
                       make_sparse_optimizer)
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


# -- row-wise Adagrad, Adam for rows, L2, the kernel path against the vectorised one -------------
def test_rowwise_adagrad_one_accumulator_per_row():
    rng = np.random.default_rng(3)
    d = 5
    opt = SparseRowwiseAdagrad(0.05, initial_accumulator=0.01)
    assert opt.state_width(d) == 1 and opt.row_width(d) == d + 1
    w = rng.normal(size=(6, d))
    rows = opt.init_rows(w)
    np.testing.assert_array_equal(rows[:, d], 0.01)
    acc = np.full(6, 0.01)
    for _ in range(3):
        g = rng.normal(size=(6, d))
        rows = opt.apply(rows, g)
        w, acc = ref.rowwise_adagrad_step(w, acc, g, 0.05, 1e-10)
        np.testing.assert_allclose(rows[:, :d], w, rtol=1e-12)
        np.testing.assert_allclose(rows[:, d], acc, rtol=1e-12)


def test_adam_rows_count_their_own_steps():
    """Rows used in fewer mini-batches have smaller step counts and their own bias correction."""
    rng = np.random.default_rng(4)
    d, u = 3, 5
    opt = SparseAdam(0.01, betas=(0.8, 0.99), eps=1e-6)
    assert opt.state_width(d) == 2 * d + 1 and opt.row_width(d) == 3 * d + 1
    w = rng.normal(size=(u, d))
    rows = opt.init_rows(w)
    assert not rows[:, d:].any()
    m, v, t = np.zeros((u, d)), np.zeros((u, d)), np.zeros(u)
    for step in range(4):
        used = np.flatnonzero(rng.random(u) < 0.6) if step else np.arange(u)
        g = rng.normal(size=(used.shape[0], d))
        rows[used] = opt.apply(rows[used], g)
        w[used], m[used], v[used], t[used] = ref.adam_row_step(w[used], m[used], v[used], t[used], g,
                                                               0.01, 0.8, 0.99, 1e-6)
    assert len(set(t.tolist())) > 1  # the rows really have different step counts
    np.testing.assert_allclose(rows[:, :d], w, rtol=1e-12)
    np.testing.assert_allclose(rows[:, d:2 * d], m, rtol=1e-12)
    np.testing.assert_allclose(rows[:, 2 * d:3 * d], v, rtol=1e-12)
    np.testing.assert_array_equal(rows[:, 3 * d], t)


def _all_row_optimizers(l2=0.0):
    return [SparseSGD(0.1, l2=l2), SparseAdagrad(0.1, initial_accumulator=0.01, l2=l2),
            SparseRowwiseAdagrad(0.1, initial_accumulator=0.01, l2=l2), SparseAdam(0.01, l2=l2)]


@pytest.mark.parametrize("opt", _all_row_optimizers(), ids=lambda o: o.name)
def test_l2_adds_l2_times_the_row_to_the_gradient(opt):
    rng = np.random.default_rng(5)
    rows = opt.init_rows(rng.normal(size=(4, 3)))
    g = rng.normal(size=(4, 3))
    with_l2 = type(opt)(**{**_hyper(opt), "l2": 0.3})
    np.testing.assert_allclose(with_l2.apply(rows, g), opt.apply(rows, g + 0.3 * rows[:, :3]), rtol=1e-12)
    assert not np.allclose(with_l2.apply(rows, g), opt.apply(rows, g))


def _hyper(opt):
    h = {"lr": opt.lr, **opt._hyper()}
    return h


def test_dense_adagrad_matches_closed_form_and_resumes():
    rng = np.random.default_rng(7)
    p0 = rng.normal(size=(3, 2))
    params = {"W": p0.copy()}
    opt = DenseAdagrad(0.05, initial_accumulator=0.1, eps=1e-10)
    w, acc = p0, np.full_like(p0, 0.1)
    gs = [rng.normal(size=(3, 2)) for _ in range(4)]
    for g in gs[:2]:
        opt.step(params, {"W": g})
        w, acc = ref.adagrad_step(w, acc, g, 0.05, 1e-10)
    np.testing.assert_allclose(params["W"], w, rtol=1e-12)
    st = opt.state_dict()
    np.testing.assert_allclose(st["acc"]["W"], acc, rtol=1e-12)
    again = DenseAdagrad(1.0)
    again.load_state_dict(st)
    assert (again.lr, again.initial_accumulator) == (0.05, 0.1)
    for g in gs[2:]:
        again.step(params, {"W": g})
        w, acc = ref.adagrad_step(w, acc, g, 0.05, 1e-10)
    np.testing.assert_allclose(params["W"], w, rtol=1e-12)


@pytest.mark.parametrize("sparse, dense", [("adagrad", "adam"), ("rowwise-adagrad", "adagrad"), ("adam", "sgd"),
                                           ("sgd", "adam")])
def test_make_optimizers_for_every_name(sparse, dense):
    cfg = ModelConfig(n_fields=2, sparse_optimizer=sparse, dense_optimizer=dense, sparse_lr=0.3, emb_l2=0.01,
                      adagrad_initial_accumulator=0.2, adam_betas=(0.5, 0.6))
    s, d = make_optimizers(cfg)
    assert (s.name, d.name, s.lr, s.l2) == (sparse, dense, 0.3, 0.01)
    if "adagrad" in sparse:
        assert s.initial_state_value == 0.2
    if sparse == "adam":
        assert s.betas == (0.5, 0.6) and s.initial_state_value == 0.0
    if dense == "adagrad":
        assert d.initial_accumulator == 0.2
    with pytest.raises(InvalidInputError):
        make_sparse_optimizer(sparse, 0.1, l2=-1.0)


@pytest.mark.parametrize("opt", [SparseSGD(0.1, l2=0.01), SparseAdagrad(0.1), SparseRowwiseAdagrad(0.1),
                                 SparseAdam(0.01)], ids=lambda o: o.name)
def test_apply_in_place_equals_apply_and_reuses_the_rows(opt):
    rng = np.random.default_rng(3)
    rows = opt.init_rows(rng.normal(size=(5, 3)).astype(np.float32))
    g = rng.normal(size=(5, 3)).astype(np.float32)
    want = opt.apply(rows, g)
    got = opt.apply_in_place(rows, g)
    assert got is rows
    np.testing.assert_array_equal(got, want)
    frozen = opt.init_rows(np.ones((2, 3), np.float32))
    frozen.flags.writeable = False                 # not writable: updated in a copy
    assert opt.apply_in_place(frozen, np.ones((2, 3), np.float32)) is not frozen


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_steps_in_work_buffers_give_the_plain_expressions_bits(dtype):
    """The dense optimizers compute in two work buffers per tensor, in the order of their formulas:
    the same bits as the plain NumPy expressions, step after step (and a reshaped tensor is fine)."""
    import math

    rng = np.random.default_rng(5)
    t = np.dtype(dtype).type
    shapes = {"W": (7, 3), "b": (3,)}
    start = {k: rng.normal(size=s).astype(dtype) for k, s in shapes.items()}
    grads = [{k: rng.normal(size=s).astype(dtype) for k, s in shapes.items()} for _ in range(4)]
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, 0.01
    for opt in (DenseAdam(lr, (b1, b2), eps), DenseAdagrad(lr, 0.1, 1e-10), DenseSGD(lr)):
        p = {k: v.copy() for k, v in start.items()}
        want = {k: v.copy() for k, v in start.items()}
        m = {k: np.zeros_like(v) for k, v in start.items()}
        v2 = {k: np.zeros_like(v) for k, v in start.items()}
        acc = {k: np.full_like(v, 0.1) for k, v in start.items()}
        for step, g in enumerate(grads, 1):
            opt.step(p, g)
            for k, w in want.items():
                if opt.name == "sgd":
                    w -= t(lr) * g[k]
                elif opt.name == "adagrad":
                    acc[k] += g[k] * g[k]
                    w -= t(lr) * g[k] / (np.sqrt(acc[k]) + t(1e-10))
                else:
                    m[k] *= t(b1)
                    m[k] += t(1 - b1) * g[k]
                    v2[k] *= t(b2)
                    v2[k] += t(1 - b2) * (g[k] * g[k])
                    w -= (t(lr / (1 - b1 ** step)) * m[k]
                          / (np.sqrt(v2[k]) / t(math.sqrt(1 - b2 ** step)) + t(eps)))
                np.testing.assert_array_equal(p[k], w, err_msg=f"{opt.name} {k} step {step}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_kernel_steps_equal_the_numpy_steps_bit_for_bit(dtype):
    """Adam and Adagrad step host tensors in one kernel pass (``_dense_kernels``): hundreds of steps give
    the bits of the NumPy work-buffer steps, parameters and state, with zero gradients, gradients over
    six decades and a zero eps (0 / 0 is NaN in both); a tensor that is not C-contiguous takes the
    NumPy steps."""
    for make in (lambda: DenseAdam(0.01, (0.8, 0.99), 1e-6), lambda: DenseAdam(0.01, eps=0.0),
                 lambda: DenseAdagrad(0.05, 0.1, 1e-10)):
        rng = np.random.default_rng(3)
        fused, plain = make(), make()
        plain._fused = lambda *a: False                  # the NumPy steps only
        start = {"W": rng.normal(size=(40, 7)).astype(dtype), "b": rng.normal(size=7).astype(dtype)}
        pf, pp = ({k: v.copy() for k, v in start.items()} for _ in range(2))
        with np.errstate(invalid="ignore", divide="ignore"):
            for _ in range(300):
                g = {k: (rng.normal(size=v.shape) * 10.0 ** rng.uniform(-4, 2) * (rng.random(v.shape) < 0.7))
                     .astype(dtype) for k, v in start.items()}
                fused.step(pf, g)
                plain.step(pp, g)
        for k in start:
            np.testing.assert_array_equal(pf[k], pp[k], err_msg=f"{fused.name} {k}")
            for s in fused._slots:
                np.testing.assert_array_equal(fused._state[s][k], plain._state[s][k], err_msg=f"{fused.name} {s}")
    strided = {"W": np.asfortranarray(rng.normal(size=(6, 5)).astype(dtype))}
    want = {"W": np.ascontiguousarray(strided["W"])}
    g = {"W": rng.normal(size=(6, 5)).astype(dtype)}
    DenseAdam(0.01).step(strided, g)
    DenseAdam(0.01).step(want, g)
    np.testing.assert_array_equal(strided["W"], want["W"])


def test_the_device_dense_step_is_chosen_by_hps_dense_step(monkeypatch):
    from hps.model._dense_optim import device_step

    monkeypatch.delenv("HPS_DENSE_STEP", raising=False)
    assert device_step() == "ops"
    monkeypatch.setenv("HPS_DENSE_STEP", "kernel")
    assert device_step() == "kernel"
    monkeypatch.setenv("HPS_DENSE_STEP", "fused")
    with pytest.raises(InvalidInputError, match="HPS_DENSE_STEP"):
        device_step()
