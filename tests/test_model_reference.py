"""The model's forward/backward, its optimizers and a whole training run against the independent
by-the-book NumPy reference (``tests/reference/model.py``: per-example backpropagation, element-wise
optimizer steps, one key at a time), on the same initial values and data. Runs everywhere; the
PyTorch comparison (``tests/test_model_torch.py``, ``bench/peer_torch.py``) needs torch."""

import numpy as np
import pytest

from hps.model import CTRModel, DenseAdam, ModelConfig, SparseAdagrad, init_embeddings
from tests.reference import model as ref

F, D, ND, H = 3, 4, 2, (6, 5)


@pytest.mark.parametrize("hidden", [H, (7,), ()])
def test_loss_and_gradients_match_the_reference_backprop(hidden):
    rng = np.random.default_rng(0)
    b = ref.random_batch(rng, 17, F, n_dense=ND, max_keys=3, vocab=4)
    _, inv = np.unique(b.keys, return_inverse=True)
    emb = rng.normal(scale=0.5, size=(inv.max() + 1, D))
    m = CTRModel(F, D, ND, hidden=hidden, seed=3, dtype=np.float64)
    for k in m.params:  # non-zero biases, so their paths count
        if k.startswith("b"):
            m.params[k][:] = rng.normal(scale=0.1, size=m.params[k].shape)
    loss, probs, g_emb, g = m.forward_backward(emb, inv, b, n_total=20)
    rloss, rprobs, rg_emb, rg = ref.forward_backward(m.params, emb, inv, b, F, n_total=20)
    assert loss == pytest.approx(rloss, rel=1e-12)
    np.testing.assert_allclose(probs, rprobs, rtol=1e-12)
    np.testing.assert_allclose(g_emb, rg_emb, rtol=1e-10, atol=1e-14)
    assert set(g) == set(rg)
    for k in g:
        np.testing.assert_allclose(g[k], rg[k], rtol=1e-10, atol=1e-14, err_msg=k)


def test_the_reference_backprop_is_the_derivative_of_the_reference_loss():
    """The reference checks itself: its analytic gradient against central differences of its loss."""
    rng = np.random.default_rng(1)
    b = ref.random_batch(rng, 9, F, n_dense=ND, max_keys=3, vocab=4)
    _, inv = np.unique(b.keys, return_inverse=True)
    emb = rng.normal(scale=0.5, size=(inv.max() + 1, D))
    params = CTRModel(F, D, ND, hidden=H, seed=1, dtype=np.float64).params
    _, _, g_emb, g = ref.forward_backward(params, emb, inv, b, F)

    def f():
        return ref.forward(params, emb, inv, b, F)[0]

    np.testing.assert_allclose(g_emb, ref.numerical_grad(f, emb), rtol=1e-5, atol=1e-8)
    for k, p in params.items():
        np.testing.assert_allclose(g[k], ref.numerical_grad(f, p), rtol=1e-5, atol=1e-8, err_msg=k)


def test_optimizer_steps_on_touched_rows_match_the_reference():
    """Sparse Adagrad updates only the rows a mini-batch touched; Adam every dense element."""
    rng = np.random.default_rng(1)
    w0 = rng.normal(size=(5, 3))
    grads = [rng.normal(size=(5, 3)) * (rng.random((5, 1)) < 0.6) for _ in range(3)]
    opt, adam = SparseAdagrad(0.05, initial_accumulator=0.01), DenseAdam(0.01)
    rows, p = opt.init_rows(w0.copy()), {"W": w0.copy()}
    w, acc = w0.copy(), np.full_like(w0, 0.01)
    rp, m, v = w0.copy(), np.zeros_like(w0), np.zeros_like(w0)
    for t, g in enumerate(grads, start=1):
        touched = np.flatnonzero(np.abs(g).sum(1) > 0)
        rows[touched] = opt.apply(rows[touched], g[touched])
        for r in touched:
            w[r], acc[r] = ref.adagrad_step(w[r], acc[r], g[r], 0.05, 1e-10)
        adam.step(p, {"W": g})
        ref.adam_step(rp, m, v, g, t, 0.01, 0.9, 0.999, 1e-8)
    np.testing.assert_allclose(rows[:, :3], w, rtol=1e-12)
    np.testing.assert_allclose(rows[:, 3:], acc, rtol=1e-12)
    np.testing.assert_allclose(p["W"], rp, rtol=1e-12)


@pytest.mark.parametrize("sparse_opt,dense_opt", [("adagrad", "adam"), ("sgd", "sgd")])
def test_training_ends_with_the_parameters_of_the_reference(sparse_opt, dense_opt):
    """bench.peer_torch's in-memory trainer (CTRModel + the row optimizers, as hps trains) and the
    reference trainer, float64, 2 epochs of 6 mini-batches from the same init -> the same state."""
    from bench.peer_torch import train_numpy_reference

    rng = np.random.default_rng(5)
    train = [ref.random_batch(rng, 16, F, n_dense=ND, max_keys=3, vocab=6) for _ in range(6)]
    ev = [ref.random_batch(rng, 40, F, n_dense=ND, max_keys=3, vocab=6)]
    cfg = ModelConfig(n_fields=F, emb_dim=D, n_dense=ND, hidden=H, seed=2, emb_init_scale=0.3,
                      sparse_optimizer=sparse_opt, dense_optimizer=dense_opt, sparse_lr=0.1, dense_lr=0.01,
                      adagrad_initial_accumulator=0.01, dtype="float64")
    got = train_numpy_reference(train, ev, cfg, epochs=2, return_state=True)
    vocab = got["vocab"]
    emb0 = dict(zip(vocab.tolist(), init_embeddings(vocab, D, cfg.seed, cfg.emb_init_scale, np.float64)))
    want_emb, want_dense = ref.train(train, emb0, CTRModel.from_config(cfg).params, F, epochs=2,
                                     sparse=sparse_opt, dense=dense_opt, lr=0.1, dense_lr=0.01,
                                     adagrad_init=0.01)
    np.testing.assert_allclose(got["table"][:, :D], np.array([want_emb[k] for k in vocab.tolist()]),
                               rtol=1e-9, atol=1e-12)
    for k in want_dense:
        np.testing.assert_allclose(got["dense"][k], want_dense[k], rtol=1e-9, atol=1e-12, err_msg=k)
    assert np.abs(got["table"][:, :D] - init_embeddings(vocab, D, cfg.seed, cfg.emb_init_scale,
                                                         np.float64)).max() > 0.01  # it trained


def test_the_training_job_ends_with_the_parameters_of_the_reference(tmp_path):
    """``python -m hps.train`` (pipeline, HBM/MEM/SSD tiers, float32) against the reference trainer
    (float64) on the same synthetic mini-batches, from the same initial values: 2 epochs, 16 steps."""
    from bench.peer_torch import minibatches
    from hps.data import open_dataset
    from hps.train import load_export, main

    shape = dict(rows=512, fields=3, vocab_per_field=20, n_dense=2)
    args = [f"--{k.replace('_', '-')}={v}" for k, v in shape.items()]
    assert main([*args, "--batch-size", "256", "--minibatch-size", "64", "--hidden", "6,5", "--embedding-dim", "4",
                 "--epochs", "2", "--lr", "0.2", "--adagrad-init", "0.001", "--dense-lr", "0.01", "--no-progress",
                 "--export", str(tmp_path / "model")]) == 0
    keys, values, dense = load_export(tmp_path / "model")

    data = open_dataset(None, "synthetic", 256, seed=0, **shape)
    batches = list(minibatches(data.batches(), 64))
    emb0 = dict(zip(keys.tolist(), init_embeddings(keys, 4, 0, 0.01, np.float32).astype(np.float64)))
    params0 = CTRModel(3, 4, 2, hidden=(6, 5), seed=0).params  # float32, as hps starts
    want_emb, want_dense = ref.train(batches, emb0, params0, 3, epochs=2, lr=0.2, dense_lr=0.01,
                                     adagrad_init=0.001)
    want = np.array([want_emb[k] for k in keys.tolist()])
    np.testing.assert_allclose(values, want, rtol=1e-4, atol=1e-6)  # float32 against float64
    for k in want_dense:
        np.testing.assert_allclose(dense[k], want_dense[k], rtol=1e-4, atol=1e-6, err_msg=k)
    assert np.abs(values - init_embeddings(keys, 4, 0, 0.01)).max() > 0.01  # it trained
