"""Every model (ctr, wdl, deepfm, dcn, dlrm): loss against the naive reference, gradients against
finite differences (float64), shares of a global mini-batch summing to the full batch, the
gather/scatter (CuPy) path against the kernels, and their configuration errors."""

import numpy as np
import pytest

from hps import InvalidInputError
from hps.data import Batch
from hps.model import DCN, DLRM, MODELS, CTRModel, DeepFM, ModelConfig, WideDeep, make_model
from tests.reference import model as ref
from tests.test_model_grad import assert_shares_sum_to_whole

F, D = 3, 4
ARCH = {"dcn": {"cross_layers": 2}, "dlrm": {"bottom_mlp": (5, D)}}
#: (model, n_dense, hidden): every model, with and without dense features, and corner shapes
CASES = [(m, nd, (6, 5)) for m in MODELS for nd in (2, 0)] + [("dcn", 2, ()), ("ctr", 2, ())]


def _model(name, n_dense, hidden, seed=0, dtype=np.float64, xp=np):
    return MODELS[name](F, D, n_dense, hidden=hidden, seed=seed, dtype=dtype, xp=xp, **ARCH.get(name, {}))


def _setup(name, n_dense=2, hidden=(6, 5), seed=0, n=12, dtype=np.float64):
    rng = np.random.default_rng(seed)
    b = ref.random_batch(rng, n, F, n_dense=n_dense, max_keys=3, vocab=4)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    m = _model(name, n_dense, hidden, seed, dtype)
    rows = rng.normal(scale=0.5, size=(uniq.shape[0], m.row_params)).astype(dtype)
    for k in m.params:  # non-zero biases so their gradient paths are exercised
        if "b" in k.split("_")[-1]:
            m.params[k][:] = rng.normal(scale=0.1, size=m.params[k].shape)
    return m, b, uniq, inv, rows


def _ref_loss(m, rows, inv, b, n_total=None):
    return ref.forward(m.params, rows, inv, b, F, n_total=n_total, model=m.name, emb_dim=D)


def test_registry_and_row_params():
    assert set(MODELS) == {"ctr", "wdl", "deepfm", "dcn", "dlrm"}
    assert [MODELS[k] for k in ("ctr", "wdl", "deepfm", "dcn", "dlrm")] == [CTRModel, WideDeep, DeepFM, DCN,
                                                                            DLRM]
    assert {k: _model(k, 2, (6,)).row_params for k in MODELS} == \
        {"ctr": D, "wdl": D + 1, "deepfm": D + 1, "dcn": D, "dlrm": D}


@pytest.mark.parametrize("name, n_dense, hidden", CASES)
def test_loss_and_probs_match_reference(name, n_dense, hidden):
    m, b, _, inv, rows = _setup(name, n_dense, hidden)
    loss, probs, _, _ = m.forward_backward(rows, inv, b)
    rloss, rprobs = _ref_loss(m, rows, inv, b)
    assert loss == pytest.approx(rloss, rel=1e-12)
    np.testing.assert_allclose(probs, rprobs, rtol=1e-12)
    np.testing.assert_allclose(m.predict(rows, inv, b), rprobs, rtol=1e-12)


@pytest.mark.parametrize("name, n_dense, hidden", CASES)
def test_gradients_match_finite_differences(name, n_dense, hidden):
    m, b, _, inv, rows = _setup(name, n_dense, hidden, seed=1)
    _, _, g_rows, g_dense = m.forward_backward(rows, inv, b)
    assert g_rows.shape == rows.shape

    def f():
        return _ref_loss(m, rows, inv, b)[0]

    np.testing.assert_allclose(g_rows, ref.numerical_grad(f, rows), rtol=1e-5, atol=1e-8)
    assert list(g_dense) == list(m.params)
    for k, p in m.params.items():
        assert g_dense[k].shape == p.shape
        np.testing.assert_allclose(g_dense[k], ref.numerical_grad(f, p), rtol=1e-5, atol=1e-8, err_msg=k)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_shares_with_n_total_sum_to_full_batch(name):
    m, b, uniq, inv, rows = _setup(name, seed=2, n=23)
    loss, _, g_rows, g_dense = m.forward_backward(rows, inv, b)
    cuts = [0, 0, 9, 23]  # an empty share too
    assert_shares_sum_to_whole(m, b, uniq, rows, cuts, (loss, g_rows, g_dense))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_generic_xp_path_matches_kernels(name, dtype):
    """The gather + scatter-add path (the one CuPy runs) on NumPy gives the kernel path's results."""
    m, b, _, inv, rows = _setup(name, seed=3, n=16, dtype=dtype)
    generic = _model(name, 2, (6, 5), seed=3, dtype=dtype)
    generic.load_state_dict(m.state_dict())
    generic.use_cpu_kernels = False
    a, c = m.forward_backward(rows, inv, b), generic.forward_backward(rows, inv, b)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert a[0] == pytest.approx(c[0], rel=tol)
    for x, y in ((a[1], c[1]), (a[2], c[2]), *((a[3][k], c[3][k]) for k in a[3])):
        assert y.dtype == dtype
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_float32_close_to_float64(name):
    m64, b, _, inv, rows = _setup(name, seed=4)
    m32 = _model(name, 2, (6, 5), seed=4, dtype=np.float32)
    m32.load_state_dict(m64.state_dict())
    a, c = m64.forward_backward(rows, inv, b), m32.forward_backward(rows.astype(np.float32), inv, b)
    assert c[2].dtype == np.float32 and all(v.dtype == np.float32 for v in c[3].values())
    assert a[0] == pytest.approx(c[0], rel=1e-5)
    np.testing.assert_allclose(c[2], a[2], rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_empty_batch_and_extreme_logits(name):
    m = _model(name, 2, (6,), dtype=np.float32)
    b = Batch(np.zeros(0, np.float32), np.zeros((0, 2), np.float32), np.zeros(0, np.uint64),
              np.zeros(0, np.int32), np.zeros(0, np.float32), np.zeros(1, np.int64), F)
    loss, probs, g_rows, g = m.forward_backward(np.zeros((0, m.row_params), np.float32), np.zeros(0, np.int64),
                                                b, n_total=8)
    assert loss == 0.0 and probs.shape == (0,) and g_rows.shape == (0, m.row_params)
    assert all((v == 0).all() for v in g.values())
    m, b, _, inv, rows = _setup(name, seed=5)
    m.params[f"b{len(m.hidden)}"][:] = 1e4  # the bias of the output layer, in every model
    loss, probs, g_rows, g = m.forward_backward(rows, inv, b)
    assert (probs == 1.0).all() and loss > 1e3
    assert np.isfinite(loss) and np.isfinite(probs).all() and np.isfinite(g_rows).all()
    assert all(np.isfinite(v).all() for v in g.values())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_init_is_deterministic_and_round_trips(name):
    a, c = _model(name, 3, (8,), seed=11), _model(name, 3, (8,), seed=11)
    for k in a.params:
        np.testing.assert_array_equal(a.params[k], c.params[k])
    assert any(not np.array_equal(_model(name, 3, (8,), seed=12).params[k], a.params[k]) for k in a.params)
    other = _model(name, 3, (8,), seed=99)
    other.load_state_dict(a.state_dict())
    for k in a.params:
        np.testing.assert_array_equal(other.params[k], a.params[k])
    with pytest.raises(InvalidInputError):
        other.load_state_dict({"W0": np.zeros((1, 1))})


def test_wdl_and_deepfm_share_the_ctr_mlp_initial_values():
    ctr = _model("ctr", 2, (6, 5), seed=7)
    for name in ("wdl", "deepfm"):
        m = _model(name, 2, (6, 5), seed=7)
        assert list(m.params) == list(ctr.params)
        for k in ctr.params:
            np.testing.assert_array_equal(m.params[k], ctr.params[k])


def test_parameter_names_and_shapes():
    K = F * D + 2
    dcn = DCN(F, D, 2, hidden=(6, 5), cross_layers=2)
    assert {k: v.shape for k, v in dcn.params.items()} == {
        "W0": (K, 6), "b0": (6,), "W1": (6, 5), "b1": (5,), "W2": (K + 5, 1), "b2": (1,),
        "cross0_W": (K, K), "cross0_b": (K,), "cross1_W": (K, K), "cross1_b": (K,)}
    dlrm = DLRM(F, D, 2, hidden=(6,), bottom_mlp=(5, D))
    m = F + 1
    assert {k: v.shape for k, v in dlrm.params.items()} == {
        "W0": (D + m * (m - 1) // 2, 6), "b0": (6,), "W1": (6, 1), "b1": (1,),
        "bot_W0": (2, 5), "bot_b0": (5,), "bot_W1": (5, D), "bot_b1": (D,)}
    no_dense = DLRM(F, D, 0, hidden=(6,))
    assert no_dense.params["W0"].shape == (F * (F - 1) // 2, 6) and "bot_W0" not in no_dense.params
    assert DLRM(F, D, 2).cfg.bottom_widths == (64, D)


def test_make_model_from_config():
    cfg = ModelConfig(n_fields=F, emb_dim=D, n_dense=2, hidden=(6,), model="dcn", cross_layers=4, seed=3)
    m = make_model(cfg)
    assert isinstance(m, DCN) and len(m.cross.layers) == 4
    assert [k for k in m.params if k.startswith("cross")][-1] == "cross3_b"
    with pytest.raises(InvalidInputError, match="config of model 'dcn'"):
        DLRM.from_config(cfg)


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="dlrm", bottom_mlp=(8, 3)), "bottom-mlp must end at the embedding width 4"),
    (dict(model="dlrm", bottom_mlp=()), "bottom-mlp needs one or more"),
    (dict(model="dcn", cross_layers=0), "cross-layers must be >= 1"),
    (dict(model="fm"), "model must be one of"),
    (dict(model="dlrm", n_fields=1, n_dense=0), "two vectors to interact"),
    (dict(sparse_optimizer="ftrl"), "sparse_optimizer must be one of"),
    (dict(dense_optimizer="rmsprop"), "dense_optimizer must be one of"),
    (dict(emb_l2=-1.0), "emb_l2"),
])
def test_bad_configs_raise_typed_errors(kwargs, message):
    args = dict(n_fields=F, emb_dim=D) | kwargs
    with pytest.raises(InvalidInputError, match=message):
        ModelConfig(**args)


def test_bad_inputs_raise_typed_errors():
    m, b, _, inv, rows = _setup("wdl")
    with pytest.raises(InvalidInputError, match=r"rows must be \(u, 5\)"):
        m.forward_backward(rows[:, :D], inv, b)  # wdl rows carry the first-order weight
    with pytest.raises(InvalidInputError):
        m.forward_backward(rows[:1], inv, b)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MODELS))
def test_cupy_path_matches_numpy(name):
    """CuPy (the same code on xp = cupy) gives the NumPy path's loss and gradients; the row
    optimizers' vectorised path on CuPy takes the kernels' steps."""
    cupy = pytest.importorskip("cupy")
    from hps.model import SparseAdam, SparseRowwiseAdagrad

    m, b, _, inv, rows = _setup(name, seed=11, n=33)
    dev = _model(name, 2, (6, 5), seed=11, xp=cupy)
    dev.load_state_dict(m.state_dict())
    a = m.forward_backward(rows, inv, b)
    c = dev.forward_backward(cupy.asarray(rows), cupy.asarray(inv), b, n_total=40)
    assert isinstance(c[2], cupy.ndarray)
    assert a[0] * len(b) / 40 == pytest.approx(c[0], rel=1e-12)
    np.testing.assert_allclose(a[2] * len(b) / 40, cupy.asnumpy(c[2]), rtol=1e-10, atol=1e-14)
    for k in a[3]:
        np.testing.assert_allclose(a[3][k] * len(b) / 40, cupy.asnumpy(c[3][k]), rtol=1e-10, atol=1e-14)
    for opt in (SparseRowwiseAdagrad(0.1, 0.01, l2=0.01), SparseAdam(0.01)):
        r = opt.init_rows(rows)
        np.testing.assert_allclose(cupy.asnumpy(opt.apply(cupy.asarray(r), c[2])),
                                   opt.apply(r, cupy.asnumpy(c[2])), rtol=1e-12)


@pytest.mark.parametrize("name, n_dense, hidden", CASES)
def test_dense_shapes_without_building_and_describe(name, n_dense, hidden):
    """What the memory preflight counts is what the model allocates; describe() names the network."""
    from hps.model import dense_shapes

    m = _model(name, n_dense, hidden)
    assert dense_shapes(m.cfg) == {k: v.shape for k, v in m.params.items()}
    text = m.describe()
    assert text.startswith(("" if name == "ctr" else f"{name}: ") + f"{F} fields x {D}-dim embeddings")
    assert text.endswith("-> sigmoid")
