"""Dense tensors as views of one flat buffer (hps/model/_flat.py): the models' parameters and a pass's
gradients are laid out so, the dense optimizer then steps all tensors in one pass, and the bits are
those of stepping tensor by tensor."""

import numpy as np
import pytest

from hps.data import Batch
from hps.model import DenseAdagrad, DenseAdam, DenseSGD, flat_of, flat_views, make_model
from hps.model._config import ModelConfig

SHAPES = {"W0": (37, 16), "b0": (16,), "W1": (16, 8), "b1": (8,), "W2": (8, 1), "b2": (1,)}
OPTIMIZERS = [lambda: DenseAdam(1e-2), lambda: DenseAdagrad(0.05, initial_accumulator=0.1), lambda: DenseSGD(0.1)]


def _tensors(rng, tiled: bool) -> dict:
    out = flat_views(np, SHAPES, np.float32) if tiled else {k: np.empty(s, np.float32) for k, s in SHAPES.items()}
    for k, s in SHAPES.items():
        out[k][...] = rng.standard_normal(s)
    return out


def test_flat_views_tile_one_buffer_in_order():
    t = flat_views(np, SHAPES, np.float32)
    assert t.flat.shape == (sum(int(np.prod(s)) for s in SHAPES.values()),)
    assert list(t) == list(SHAPES) and t.layout == tuple(SHAPES.items())
    t.flat[:] = np.arange(t.flat.shape[0])
    assert t["W0"][0, 1] == 1 and t["b0"][0] == 37 * 16 and t["b2"][0] == t.flat.shape[0] - 1
    assert flat_of(t) is t.flat


def test_flat_of_refuses_what_is_not_intact():
    t = flat_views(np, SHAPES, np.float32)
    assert flat_of(dict(t)) is None                       # a plain dict of the same views
    t["b1"] = np.zeros(8, np.float32)                     # an entry replaced
    assert flat_of(t) is None
    assert flat_of(flat_views(np, {"w": (3,)}, np.float32)) is None   # one tensor: nothing to gain


@pytest.mark.parametrize("make_opt", OPTIMIZERS, ids=["adam", "adagrad", "sgd"])
def test_a_tiled_step_has_the_bits_of_the_per_tensor_step(make_opt):
    rng = np.random.default_rng(0)
    params_t, params_p = _tensors(rng, True), None
    params_p = {k: v.copy() for k, v in params_t.items()}
    opt_t, opt_p = make_opt(), make_opt()
    for _ in range(40):
        g = rng.standard_normal(sum(int(np.prod(s)) for s in SHAPES.values())).astype(np.float32)
        grads_t = flat_views(np, SHAPES, np.float32, flat=g.copy())
        grads_p = {k: v.copy() for k, v in grads_t.items()}
        opt_t.step(params_t, grads_t)
        opt_p.step(params_p, grads_p)
    assert opt_t._tiled is not None and opt_p._tiled is None   # the tiled step ran; the plain dicts' did not
    for k in SHAPES:
        assert np.array_equal(params_t[k], params_p[k]), k
    st_t, st_p = opt_t.state_dict(), opt_p.state_dict()
    for slot in opt_t._slots:
        for k in SHAPES:
            assert np.array_equal(st_t[slot][k], st_p[slot][k]), (slot, k)


def test_a_loaded_state_is_laid_out_anew_and_steps_as_loaded():
    rng = np.random.default_rng(1)
    params = _tensors(rng, True)
    opt = DenseAdam(1e-2)
    grads = flat_views(np, SHAPES, np.float32)
    grads.flat[:] = rng.standard_normal(grads.flat.shape[0])
    for _ in range(3):
        opt.step(params, grads)
    saved, saved_params = opt.state_dict(), {k: v.copy() for k, v in params.items()}
    for _ in range(2):
        opt.step(params, grads)
    after_two = {k: v.copy() for k, v in params.items()}
    for k, v in saved_params.items():   # back to the checkpoint: parameters in place, the state loaded
        params[k][...] = v
    opt.load_state_dict(saved)
    for _ in range(2):
        opt.step(params, grads)
    for k in SHAPES:
        assert np.array_equal(params[k], after_two[k]), k
    m = [opt._state["m"][k] for k in SHAPES]
    assert all(a.base is m[0].base for a in m)                # tiled again after the load


def test_a_replaced_gradient_steps_tensor_by_tensor_with_the_same_bits():
    rng = np.random.default_rng(2)
    params_a, opt_a, opt_b = _tensors(rng, True), DenseAdam(1e-2), DenseAdam(1e-2)
    params_b = flat_views(np, SHAPES, np.float32)
    params_b.flat[:] = params_a.flat
    for _ in range(5):
        grads = flat_views(np, SHAPES, np.float32)
        grads.flat[:] = rng.standard_normal(grads.flat.shape[0])
        plain = dict(grads)
        plain["b2"] = grads["b2"].copy()   # no longer one buffer
        opt_a.step(params_a, grads)
        opt_b.step(params_b, plain)
    assert np.array_equal(params_a.flat, params_b.flat)


@pytest.mark.parametrize("model", ["ctr", "dcn", "dlrm"])
def test_a_models_parameters_and_gradients_are_one_buffer_each(model):
    cfg = ModelConfig(n_fields=3, emb_dim=4, n_dense=2, hidden=(8, 4), seed=0, dtype="float32", model=model)
    m = make_model(cfg)
    assert flat_of(m.params) is not None
    rng = np.random.default_rng(3)
    n = 600   # more than one chunk of the host pass: the later chunks are added into the first's buffer
    keys = rng.integers(0, 50, size=3 * n).astype(np.uint64)
    batch = Batch(keys=keys, field=np.tile(np.arange(3, dtype=np.int32), n), weights=np.ones(3 * n, np.float32),
                  offsets=np.arange(0, 3 * n + 1, 3, dtype=np.int64), labels=rng.integers(0, 2, n).astype(np.float32),
                  dense=rng.standard_normal((n, 2)).astype(np.float32), n_fields=3)
    uniq, inv = np.unique(keys, return_inverse=True)
    rows = rng.standard_normal((uniq.shape[0], m.row_params)).astype(np.float32)
    grads = m.forward_backward(rows, inv, batch)[3]
    assert flat_of(grads) is not None and grads.layout == m.params.layout
    again = m.forward_backward(rows, inv, batch)[3]
    assert flat_of(again) is not flat_of(grads)              # a new buffer per pass
    for k in grads:
        assert np.array_equal(grads[k], again[k]), k
    state = {k: np.full(v.shape, 0.5, np.float32) for k, v in m.params.items()}
    m.load_state_dict(state)                                   # in place: still one buffer
    assert flat_of(m.params) is not None and np.all(flat_of(m.params) == 0.5)
