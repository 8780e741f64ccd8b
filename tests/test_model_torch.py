"""The models and the optimizers against PyTorch on the same inputs — skipped without torch (CI installs
none; the parity that runs everywhere is ``tests/test_model_reference.py`` and ``tests/test_model_zoo.py``,
against the NumPy references): torch's autograd through the same networks written in torch operations
(``bench/_torch_models.py``) checks hps's hand-written backward, and whole training runs end with the
same parameters."""

import numpy as np
import pytest

from hps.model import MODELS, CTRModel, DenseAdagrad, DenseAdam, SparseAdagrad, SparseAdam
from tests.reference import model as ref

torch = pytest.importorskip("torch")

F, D, ND, H = 3, 4, 2, (6, 5)


def _torch_forward(m, emb_rows, inv, b):
    """Same network in torch: EmbeddingBag(sum, per_sample_weights) over (example, field) bags."""
    from bench.peer_torch import bag_inputs

    emb = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(emb_rows), mode="sum", freeze=False, sparse=True)
    idx, off, w = bag_inputs(inv, b)
    pooled = emb(torch.from_numpy(idx), torch.from_numpy(off),
                 per_sample_weights=torch.from_numpy(w).double())
    x = torch.cat([pooled.view(len(b), F * D), torch.from_numpy(b.dense.astype(np.float64))], dim=1)
    ps = {k: torch.tensor(v, requires_grad=True) for k, v in m.params.items()}
    h = x
    for i in range(m.n_layers):
        h = h @ ps[f"W{i}"] + ps[f"b{i}"]
        if i < m.n_layers - 1:
            h = torch.relu(h)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(h[:, 0], torch.from_numpy(b.labels).double())
    loss.backward()
    return loss, emb, ps


def test_loss_and_gradients_match_torch():
    rng = np.random.default_rng(0)
    b = ref.random_batch(rng, 17, F, n_dense=ND, max_keys=3, vocab=4)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    emb = rng.normal(scale=0.5, size=(uniq.shape[0], D))
    m = CTRModel(F, D, ND, hidden=H, seed=3, dtype=np.float64)
    loss, _, g_emb, g = m.forward_backward(emb, inv, b)
    tloss, temb, tps = _torch_forward(m, emb, inv, b)
    assert loss == pytest.approx(tloss.item(), rel=1e-12)
    np.testing.assert_allclose(g_emb, temb.weight.grad.to_dense().numpy(), rtol=1e-10, atol=1e-14)
    for k in g:
        np.testing.assert_allclose(g[k], tps[k].grad.numpy(), rtol=1e-10, atol=1e-14, err_msg=k)


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
def test_optimizer_steps_match_torch():
    rng = np.random.default_rng(1)
    w0 = rng.normal(size=(5, 3))
    grads = [rng.normal(size=(5, 3)) * (rng.random((5, 1)) < 0.6) for _ in range(3)]
    # Adagrad (sparse torch grads, one row update per touched key) vs SparseAdagrad on touched rows
    tw = torch.nn.Parameter(torch.tensor(w0))
    topt = torch.optim.Adagrad([tw], lr=0.05, eps=1e-10)
    opt = SparseAdagrad(0.05)
    rows = opt.init_rows(w0.copy())
    # Adam on a dense tensor
    aw = torch.nn.Parameter(torch.tensor(w0))
    aopt = torch.optim.Adam([aw], lr=0.01, betas=(0.9, 0.999), eps=1e-8)
    adam, p = DenseAdam(0.01), {"W": w0.copy()}
    for g in grads:
        touched = np.flatnonzero(np.abs(g).sum(1) > 0)
        tw.grad = torch.sparse_coo_tensor(torch.tensor(touched)[None], torch.tensor(g[touched]), (5, 3),
                                          check_invariants=True)
        topt.step()
        rows[touched] = opt.apply(rows[touched], g[touched])
        aw.grad = torch.tensor(g)
        aopt.step()
        adam.step(p, {"W": g})
    np.testing.assert_allclose(rows[:, :3], tw.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(p["W"], aw.detach().numpy(), rtol=1e-12)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_matches_torch_autograd(name):
    from bench._torch_models import make_net
    from bench.peer_torch import bag_inputs

    rng = np.random.default_rng(2)
    b = ref.random_batch(rng, 17, F, n_dense=ND, max_keys=3, vocab=4)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    m = MODELS[name](F, D, ND, hidden=H, seed=3, dtype=np.float64,
                     **({"bottom_mlp": (5, D)} if name == "dlrm" else {}))
    rows = rng.normal(scale=0.5, size=(uniq.shape[0], m.row_params))
    loss, _, g_rows, g = m.forward_backward(rows, inv, b)
    net = make_net(m)
    emb = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(rows), mode="sum", freeze=False, sparse=True)
    idx, off, w = bag_inputs(inv, b)
    pooled = emb(torch.from_numpy(idx), torch.from_numpy(off), per_sample_weights=torch.from_numpy(w).double())
    z = net(pooled.view(len(b), -1), torch.from_numpy(b.dense.astype(np.float64)))
    tloss = torch.nn.functional.binary_cross_entropy_with_logits(z, torch.from_numpy(b.labels).double())
    tloss.backward()
    assert loss == pytest.approx(tloss.item(), rel=1e-12)
    np.testing.assert_allclose(g_rows, emb.weight.grad.to_dense().numpy(), rtol=1e-10, atol=1e-14)
    for k in g:
        np.testing.assert_allclose(g[k], net.p[k].grad.numpy(), rtol=1e-10, atol=1e-14, err_msg=k)


def test_row_adam_and_dense_adagrad_match_torch():
    """Rows all used at every step: the per-row step count equals torch's per-tensor one."""
    rng = np.random.default_rng(4)
    w0 = rng.normal(size=(4, 3))
    tw, aw = torch.nn.Parameter(torch.tensor(w0)), torch.nn.Parameter(torch.tensor(w0))
    tadam = torch.optim.Adam([tw], lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    tada = torch.optim.Adagrad([aw], lr=0.05, eps=1e-10, initial_accumulator_value=0.1)
    opt, ada, p = SparseAdam(0.01, betas=(0.8, 0.99), eps=1e-6), DenseAdagrad(0.05, 0.1), {"W": w0.copy()}
    rows = opt.init_rows(w0.copy())
    for _ in range(4):
        g = rng.normal(size=(4, 3))
        tw.grad, aw.grad = torch.tensor(g), torch.tensor(g)
        tadam.step()
        tada.step()
        rows = opt.apply(rows, g)
        ada.step(p, {"W": g})
    np.testing.assert_allclose(rows[:, :3], tw.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(p["W"], aw.detach().numpy(), rtol=1e-12)


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
@pytest.mark.parametrize("model, sparse_opt, dense_opt, l2", [
    ("ctr", "adagrad", "adam", 0.0), ("ctr", "sgd", "sgd", 0.0), ("wdl", "rowwise-adagrad", "adagrad", 0.0),
    ("deepfm", "adam", "adam", 0.01), ("dcn", "adagrad", "adam", 0.01), ("dlrm", "adagrad", "adam", 0.0)])
def test_peer_trainers_end_with_the_same_parameters(model, sparse_opt, dense_opt, l2):
    """bench.peer_torch: torch and the in-memory NumPy reference, float64, 6 mini-batches -> same state."""
    from bench.peer_torch import train_numpy_reference, train_torch
    from hps.model import ModelConfig

    rng = np.random.default_rng(5)
    train = [ref.random_batch(rng, 16, F, n_dense=ND, max_keys=3, vocab=6) for _ in range(6)]
    ev = [ref.random_batch(rng, 40, F, n_dense=ND, max_keys=3, vocab=6)]
    cfg = ModelConfig(n_fields=F, emb_dim=D, n_dense=ND, hidden=H, seed=2, emb_init_scale=0.3, model=model,
                      sparse_optimizer=sparse_opt, dense_optimizer=dense_opt, sparse_lr=0.1, emb_l2=l2,
                      adagrad_initial_accumulator=0.01, dense_lr=0.01, dtype="float64")
    a = train_numpy_reference(train, ev, cfg, epochs=2, return_state=True)
    t = train_torch(train, ev, cfg, epochs=2, threads=1, return_state=True)
    P = D + MODELS[model].first_order
    np.testing.assert_array_equal(a["vocab"], t["vocab"])
    np.testing.assert_allclose(a["table"][:, :P], t["table"], rtol=1e-9, atol=1e-12)
    assert set(a["dense"]) == set(t["dense"])
    for k in a["dense"]:
        np.testing.assert_allclose(a["dense"][k], t["dense"][k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert a["auc"] == pytest.approx(t["auc"], abs=1e-9)
    assert a["examples"] == t["examples"] == 2 * 6 * 16
