"""CTRModel and the optimizers against PyTorch on the same inputs — skipped without torch (CI installs
none); the parity that runs everywhere is ``tests/test_model_reference.py``, against the NumPy reference."""

import numpy as np
import pytest

from hps.model import CTRModel, DenseAdam, SparseAdagrad
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


@pytest.mark.filterwarnings("ignore:Sparse invariant checks")
@pytest.mark.parametrize("sparse_opt,dense_opt", [("adagrad", "adam"), ("sgd", "sgd")])
def test_peer_trainers_end_with_the_same_parameters(sparse_opt, dense_opt):
    """bench.peer_torch: torch and the in-memory NumPy reference, float64, 6 mini-batches -> same state."""
    from bench.peer_torch import train_numpy_reference, train_torch
    from hps.model import ModelConfig

    rng = np.random.default_rng(5)
    train = [ref.random_batch(rng, 16, F, n_dense=ND, max_keys=3, vocab=6) for _ in range(6)]
    ev = [ref.random_batch(rng, 40, F, n_dense=ND, max_keys=3, vocab=6)]
    cfg = ModelConfig(n_fields=F, emb_dim=D, n_dense=ND, hidden=H, seed=2, emb_init_scale=0.3,
                      sparse_optimizer=sparse_opt, dense_optimizer=dense_opt, sparse_lr=0.1,
                      dense_lr=0.01, dtype="float64")
    a = train_numpy_reference(train, ev, cfg, epochs=2, return_state=True)
    t = train_torch(train, ev, cfg, epochs=2, threads=1, return_state=True)
    np.testing.assert_array_equal(a["vocab"], t["vocab"])
    np.testing.assert_allclose(a["table"][:, :D], t["table"], rtol=1e-9, atol=1e-12)
    for k in a["dense"]:
        np.testing.assert_allclose(a["dense"][k], t["dense"][k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert a["auc"] == pytest.approx(t["auc"], abs=1e-9)
    assert a["examples"] == t["examples"] == 2 * 6 * 16
