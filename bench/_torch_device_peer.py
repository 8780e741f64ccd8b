"""The PyTorch peer of ``python -m hps.train --device cuda --model ctr`` for ``bench.bench_device``: the
same network and shapes (``fields`` embeddings of ``dim`` concatenated with the dense features -> MLP
``hidden`` -> logit, BCE), rows in ``nn.Embedding(sparse=True)`` with ``torch.optim.Adagrad``, the MLP
with ``torch.optim.Adam``, at hps's default learning rates. Its data (Zipf value popularity, the hps
synthetic generator's default exponent) is made on the device before the timed loop, which covers
training only: a generous peer (no parsing, no tiers). With TorchRec installed, its fused embedding
(``EmbeddingBagCollection`` + ``FusedEmbeddingBagCollection`` Adagrad) is timed too."""

from __future__ import annotations

import time

from hps._data_options import SYNTHETIC_DEFAULTS

#: mini-batches run before the timed loop (kernel selection, allocator warm-up)
WARMUP_STEPS = 20


def _data(torch, rows: int, fields: int, vocab: int, n_dense: int, zipf: float, dev: str):
    g = torch.Generator(device=dev).manual_seed(0)
    p = 1.0 / torch.arange(1, vocab + 1, device=dev, dtype=torch.float64) ** zipf
    cdf = torch.cumsum(p / p.sum(), 0)
    ids = torch.empty((rows, fields), dtype=torch.int64, device=dev)
    for f in range(fields):  # popularity rank -> a value of field f, in a random order per field
        u = torch.rand(rows, device=dev, generator=g, dtype=torch.float64)
        rank = torch.searchsorted(cdf, u).clamp_(max=vocab - 1)
        ids[:, f] = torch.randperm(vocab, device=dev, generator=g)[rank] + f * vocab
    dense = torch.randn((rows, n_dense), device=dev, generator=g)
    labels = (torch.rand(rows, device=dev, generator=g) < 0.25).float()
    return ids, dense, labels


def train_peer(rows: int, fields: int, vocab: int, dim: int, minibatch: int, hidden=(512, 256),
               n_dense: int = SYNTHETIC_DEFAULTS["n_dense"], zipf: float = SYNTHETIC_DEFAULTS["zipf"],
               lr: float = 0.2, dense_lr: float = 1e-3, device: str = "cuda") -> dict:
    """Train one pass over ``rows`` examples in mini-batches of ``minibatch`` on ``device`` -> {examples,
    seconds, examples_per_sec, torch}. ``device="cpu"`` runs the same loop on the CPU (a proof run)."""
    import torch
    from torch import nn

    ids, dense, labels = _data(torch, rows, fields, vocab, n_dense, zipf, device)
    widths = [fields * dim + n_dense, *hidden]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    mlp = nn.Sequential(*layers, nn.Linear(widths[-1], 1)).to(device)
    emb = nn.Embedding(fields * vocab, dim, sparse=True).to(device)
    nn.init.uniform_(emb.weight, -0.01, 0.01)
    sparse_opt = torch.optim.Adagrad(list(emb.parameters()), lr=lr)
    dense_opt = torch.optim.Adam(mlp.parameters(), lr=dense_lr)
    loss_fn = nn.BCEWithLogitsLoss()

    def step(s: int) -> None:
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        x = torch.cat([emb(ids[s:s + minibatch]).flatten(1), dense[s:s + minibatch]], 1)
        loss_fn(mlp(x).squeeze(1), labels[s:s + minibatch]).backward()
        sparse_opt.step()
        dense_opt.step()

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    warm = min(WARMUP_STEPS, max(1, rows // minibatch // 4))
    for s in range(0, warm * minibatch, minibatch):
        step(s)
    sync()
    t = time.perf_counter()
    n = 0
    for s in range(warm * minibatch, rows - minibatch + 1, minibatch):
        step(s)
        n += minibatch
    sync()
    el = time.perf_counter() - t
    return {"peer": "torch nn.Embedding(sparse=True) + Adagrad, Adam dense", "torch": torch.__version__,
            "examples": n, "seconds": el, "examples_per_sec": n / el if el else 0.0, "device": device}
