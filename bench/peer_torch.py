"""PyTorch peer of the hps models (``--model ctr|wdl|deepfm|dcn|dlrm``), and the "everything in
memory" NumPy reference trainer.

Both train the same network as ``hps.model.make_model(cfg)`` from the same initial values, with the
same optimizers, on the same mini-batches in the same order, on the same cores:

- :func:`train_torch`: ``nn.EmbeddingBag(mode="sum", per_sample_weights)`` over one bag per
  (example, field) of rows of ``row_params`` columns (embedding, and the first-order weight for
  wdl/deepfm), the network written in torch operations with dense values copied from the hps model
  (``bench/_torch_models.py``), ``torch.optim.Adagrad`` (or SGD) for the rows — row-wise Adagrad,
  Adam for rows and L2 as torch tensor operations — and ``torch.optim.Adam`` / ``Adagrad`` / ``SGD``
  for the dense parameters.
- :func:`train_numpy_reference`: the hps model + the row optimizers over one in-memory row array
  (no tiers, no pipeline): what hps must reproduce.

Rows start from :func:`hps.model.init_embeddings` of each key (the table is the sorted union of
the keys of the train and eval data, so no key is missing at eval). Every ``Batch`` handed to the
trainers is one mini-batch (one optimizer step); :func:`minibatches` cuts bigger batches. The peers'
data preparation (key -> table row, EmbeddingBag inputs, tensors) happens before their timed loop.

Same cores: ``--cores N`` (default 2) pins the whole process (hps's pipeline threads, the peers, every
BLAS / OpenMP / Numba pool) to the same N CPUs with ``os.sched_setaffinity``, sets
``torch.set_num_threads(N)`` and ``OPENBLAS/OMP/MKL/NUMBA_NUM_THREADS=N``. hps runs a 4-thread
pipeline, the peers one Python thread plus their thread pools, so each trainer's examples/s is also
given per busy core: busy cores = process CPU seconds / wall seconds over its training (for hps, the
``Trainer.fit`` call), per-core examples/s = examples/s / busy cores.

Run::

    python -m bench.peer_torch --data synthetic --rows 200000 --cores 2
    python -m bench.peer_torch --data frappe --epochs 3 --cores 2
    python -m bench.peer_torch --data criteo --rows 200000 --cores 2   # generated Criteo-format file
    python -m bench.peer_torch --model dcn --cross-layers 3 --sparse-optimizer rowwise-adagrad

prints AUC / logloss / examples/s / busy cores / per-core examples/s of each trainer and the ratios
of hps and the NumPy reference to torch, overall and per core.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hps._argparse import ArgumentParser
from hps.data import Batch, open_dataset
from hps.metrics import auc, logloss
from hps.model import MODELS, ModelConfig, init_embeddings, make_model, make_optimizers

__all__ = ["bag_inputs", "minibatches", "build_vocab", "train_torch", "train_numpy_reference", "CpuClock"]

FRAPPE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "frappe"


# -- data helpers -------------------------------------------------------------------------------
def minibatches(batches, size: int):
    """Yield mini-batches of ``size`` examples (the last one of each input batch may be shorter)."""
    for b in batches:
        for s in range(0, len(b), size):
            yield b.slice(s, min(s + size, len(b)))


def build_vocab(*batch_lists) -> np.ndarray:
    """Sorted unique keys (V,) uint64 of all batches: row i of a flat table holds key vocab[i]."""
    keys = [b.keys for bl in batch_lists for b in bl]
    return np.unique(np.concatenate(keys)) if keys else np.empty(0, np.uint64)


def bag_inputs(ids, batch: Batch):
    """EmbeddingBag inputs with one bag per (example, field): bag e * F + f.

    ids (nnz,) int: table row of each key occurrence. Returns (input (nnz,) int64, offsets (n*F,)
    int64, per_sample_weights (nnz,) float32), occurrences reordered by bag.
    """
    F = batch.n_fields
    slot = batch.example.astype(np.int64) * F + batch.field
    order = np.argsort(slot, kind="stable")
    offsets = np.searchsorted(slot[order], np.arange(len(batch) * F, dtype=np.int64)).astype(np.int64)
    return (np.ascontiguousarray(np.asarray(ids, dtype=np.int64)[order]), offsets,
            np.ascontiguousarray(batch.weights[order], dtype=np.float32))


class CpuClock:
    """``with clock:`` measures wall seconds and this process's CPU seconds (all threads) over the block;
    ``busy_cores`` = cpu / wall."""

    wall = cpu = 0.0

    def __enter__(self):
        self._w0, self._c0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self._w0
        self.cpu = time.process_time() - self._c0

    @property
    def busy_cores(self) -> float:
        return self.cpu / self.wall if self.wall else 0.0


def _evaluate(predict, eval_batches):
    ys, ps = [], []
    for b in eval_batches:
        ys.append(b.labels)
        ps.append(np.asarray(predict(b), dtype=np.float64))
    y, p = np.concatenate(ys), np.concatenate(ps)
    return float(auc(y, p)), float(logloss(y, p))


# -- trainers -----------------------------------------------------------------------------------
def train_numpy_reference(train_batches, eval_batches, cfg: ModelConfig, epochs: int = 1,
                          vocab: np.ndarray | None = None, return_state: bool = False) -> dict:
    """Train ``make_model(cfg)`` with the row optimizers over one in-memory table; no tiers.

    train_batches / eval_batches: lists of host ``Batch`` (each one mini-batch). Returns
    ``dict(auc, logloss, examples_per_sec, train_seconds, examples)``; with ``return_state`` also
    ``vocab`` (V,) uint64, ``table`` (V, row_width) rows and ``dense`` (name -> array).
    """
    vocab = build_vocab(train_batches, eval_batches) if vocab is None else vocab
    model = make_model(cfg)
    sparse, dense = make_optimizers(cfg)
    d = model.row_params
    table = sparse.init_rows(init_embeddings(vocab, d, cfg.seed, cfg.emb_init_scale, model.dtype))
    ids = [np.searchsorted(vocab, b.keys) for b in train_batches]  # data preparation, untimed
    if train_batches:  # warm-up (JIT compile or load the kernels' cache) outside the timing; no step
        uids, inv = np.unique(ids[0], return_inverse=True)
        model.forward_backward(table[uids, :d], inv, train_batches[0])
    n_ex = 0
    with CpuClock() as clock:
        for _ in range(epochs):
            for b, b_ids in zip(train_batches, ids):
                uids, inv = np.unique(b_ids, return_inverse=True)
                rows = table[uids]
                _, _, g_emb, g_dense = model.forward_backward(rows[:, :d], inv, b)
                table[uids] = sparse.apply(rows, g_emb)
                dense.step(model.params, g_dense)
                n_ex += len(b)
    secs = clock.wall

    def predict(b):
        uids, inv = np.unique(np.searchsorted(vocab, b.keys), return_inverse=True)
        return model.predict(table[uids, :d], inv, b)

    a, ll = _evaluate(predict, eval_batches)
    out = dict(auc=a, logloss=ll, examples_per_sec=n_ex / secs, train_seconds=secs, examples=n_ex,
               busy_cores=clock.busy_cores)
    if return_state:
        out.update(vocab=vocab, table=table, dense=model.state_dict())
    return out


def train_torch(train_batches, eval_batches, cfg: ModelConfig, epochs: int = 1, threads: int | None = None,
                vocab: np.ndarray | None = None, return_state: bool = False) -> dict:
    """The same training in PyTorch (CPU). Arguments and result as :func:`train_numpy_reference`;
    ``threads`` sets ``torch.set_num_threads``."""
    import torch
    from torch import nn

    from bench._torch_models import TorchRows, make_net

    if threads is not None:
        torch.set_num_threads(int(threads))
    torch.sparse.check_sparse_tensor_invariants.disable()  # torch's default, said explicitly
    torch.manual_seed(cfg.seed)
    tdtype = getattr(torch, cfg.dtype)
    vocab = build_vocab(train_batches, eval_batches) if vocab is None else vocab
    ref = make_model(cfg)  # the initial dense values, copied
    sparse_ref, _ = make_optimizers(cfg)
    P = ref.row_params
    rows = TorchRows(init_embeddings(vocab, P, cfg.seed, cfg.emb_init_scale, ref.dtype), sparse_ref, tdtype)
    emb = rows.bag
    net = make_net(ref)
    dense_opts = {"adam": lambda ps: torch.optim.Adam(ps, lr=cfg.dense_lr, betas=cfg.adam_betas, eps=cfg.adam_eps),
                  "adagrad": lambda ps: torch.optim.Adagrad(
                      ps, lr=cfg.dense_lr, eps=cfg.adagrad_eps,
                      initial_accumulator_value=cfg.adagrad_initial_accumulator),
                  "sgd": lambda ps: torch.optim.SGD(ps, lr=cfg.dense_lr)}
    opt_d = dense_opts[cfg.dense_optimizer](net.parameters())
    F = cfg.n_fields
    np_dtype = np.dtype(cfg.dtype)

    def prepare(b):
        """Tensors of one batch: (n, input, offsets, per-sample weights, dense or None, labels)."""
        idx, off, w = bag_inputs(np.searchsorted(vocab, b.keys), b)
        dense_x = torch.from_numpy(b.dense.astype(np_dtype, copy=False)) if cfg.n_dense else None
        return (len(b), torch.from_numpy(idx), torch.from_numpy(off),
                torch.from_numpy(w.astype(np_dtype, copy=False)), dense_x,
                torch.from_numpy(b.labels.astype(np_dtype, copy=False)))

    def logits(p):
        n, idx, off, w, dense_x, _ = p
        return net(emb(idx, off, per_sample_weights=w).view(n, F * P), dense_x)

    prepared = [prepare(b) for b in train_batches if len(b)]  # data preparation, untimed
    if prepared:  # warm-up outside the timing, as for the reference; no step
        logits(prepared[0]).sum().backward()
    n_ex = 0
    with CpuClock() as clock:
        for _ in range(epochs):
            for p in prepared:
                loss = nn.functional.binary_cross_entropy_with_logits(logits(p), p[-1])
                rows.zero_grad()
                opt_d.zero_grad(set_to_none=True)
                loss.backward()
                rows.step()
                opt_d.step()
                n_ex += p[0]
    secs = clock.wall

    def predict(b):
        with torch.no_grad():
            return torch.sigmoid(logits(prepare(b))).numpy()

    a, ll = _evaluate(predict, eval_batches)
    out = dict(auc=a, logloss=ll, examples_per_sec=n_ex / secs, train_seconds=secs, examples=n_ex,
               busy_cores=clock.busy_cores)
    if return_state:
        out.update(vocab=vocab, table=emb.weight.detach().numpy()[: vocab.shape[0]].copy(),
                   dense={k: v.detach().numpy().copy() for k, v in net.p.items()})
    return out


def train_hps(args) -> dict:
    """The real thing: ``hps.train.run`` (pipeline, HBM/MEM/SSD tiers) on the same data, model,
    optimizers and mini-batch order. Its examples/s includes reading and parsing the data, which the
    peers get pre-loaded in memory. Busy cores: the process's CPU seconds over the timed training
    (``train_cpu_seconds`` / ``train_seconds`` of its metrics; the kernel warm-up is outside both)."""
    from hps.config import Config
    from hps.train import run

    flat = dict(format=args.data if args.data == "synthetic" else "libsvm", epochs=args.epochs, seed=args.seed,
                batch_size=args.batch_size, minibatch_size=args.minibatch_size,
                embedding_dim=args.embedding_dim,
                hidden=_widths(args.hidden), lr=args.sparse_lr,
                dense_lr=args.dense_lr, adagrad_init=args.adagrad_init, progress=False,
                model=args.model, sparse_optimizer=args.sparse_optimizer, dense_optimizer=args.dense_optimizer,
                emb_l2=args.emb_l2)
    if args.model == "dcn":
        flat["cross_layers"] = args.cross_layers
    if args.model == "dlrm" and args.bottom_mlp:
        flat["bottom_mlp"] = _widths(args.bottom_mlp)
    if args.data == "synthetic":
        flat.update(rows=args.rows, fields=args.fields, vocab_per_field=args.vocab_per_field, zipf=args.zipf,
                    n_dense=args.n_dense)
    elif args.data == "criteo":
        flat.update(format="criteo", data=args.criteo_file, eval_data=args.criteo_eval)
    else:
        flat.update(data=str(Path(args.frappe_dir) / "frappe.validation.libfm"),
                    eval_data=str(Path(args.frappe_dir) / "frappe.test.libfm"))
    m = run(Config.from_flat(flat), log=lambda *a, **k: None)
    return dict(auc=m["auc"], logloss=m["logloss"], examples_per_sec=m["examples_per_sec"],
                train_seconds=m["train_seconds"], examples=m["examples"],
                busy_cores=m["train_cpu_seconds"] / m["train_seconds"] if m["train_seconds"] else 0.0)


# -- CLI ----------------------------------------------------------------------------------------
def _widths(text: str) -> tuple[int, ...]:
    return tuple(int(h) for h in text.split(",") if h.strip())


def _load(args):
    """(train mini-batches, eval mini-batches, n_fields, n_dense, note) as lists in memory."""
    if args.data == "synthetic":
        ds = open_dataset(None, "synthetic", args.batch_size, rows=args.rows, fields=args.fields,
                          vocab_per_field=args.vocab_per_field, zipf=args.zipf, n_dense=args.n_dense,
                          seed=args.seed)
        train, ev = list(ds.batches()), list(ds.eval_batches())
        note = f"synthetic: Bayes AUC {ds.bayes_auc():.4f}"
    elif args.data == "criteo":
        tr = open_dataset(args.criteo_file, "criteo", args.batch_size)
        te = open_dataset(args.criteo_eval, "criteo", args.batch_size)
        train, ev = list(tr.batches()), list(te.batches())
        note = f"criteo: train {Path(args.criteo_file).name}, eval {Path(args.criteo_eval).name}"
    else:
        d = Path(args.frappe_dir)
        tr = open_dataset(d / "frappe.validation.libfm", "libsvm", args.batch_size)
        te = open_dataset(d / "frappe.test.libfm", "libsvm", args.batch_size, n_fields=tr.n_fields)
        train, ev = list(tr.batches()), list(te.batches())
        note = "frappe: train frappe.validation.libfm, eval frappe.test.libfm"
    nf, nd = train[0].n_fields, train[0].dense.shape[1]
    train = list(minibatches(train, args.minibatch_size))
    return train, ev, nf, nd, note


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.peer_torch", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", choices=["synthetic", "frappe", "criteo"], default="synthetic")
    p.add_argument("--frappe-dir", default=str(FRAPPE_DIR))
    p.add_argument("--criteo-file", default=None,
                   help="criteo: training file (default: --rows lines generated by bench.train_scaling.write_criteo, "
                        "seed 1, with an eval file of --rows / 10 lines, seed 2, in a temporary folder)")
    p.add_argument("--criteo-eval", default=None, help="criteo: eval file (with --criteo-file)")
    p.add_argument("--rows", type=int, default=200_000, help="synthetic and generated criteo training rows")
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--vocab-per-field", type=int, default=20_000)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--n-dense", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=16384, help="hps pipeline batch (data is read in these)")
    p.add_argument("--minibatch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--model", choices=sorted(MODELS), default="ctr")
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--hidden", default="128,64", help="comma-separated widths ('' = none); dlrm: the top MLP")
    p.add_argument("--cross-layers", type=int, default=3, help="dcn: cross layers")
    p.add_argument("--bottom-mlp", default="", help="dlrm: bottom MLP widths (64,embedding-dim)")
    p.add_argument("--sparse-optimizer", default="adagrad", help="adagrad | rowwise-adagrad | adam | sgd")
    p.add_argument("--dense-optimizer", default="adam", help="adam | adagrad | sgd")
    p.add_argument("--emb-l2", type=float, default=0.0)
    p.add_argument("--sparse-lr", type=float, default=0.2)
    p.add_argument("--adagrad-init", type=float, default=0.001)
    p.add_argument("--dense-lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cores", type=int, default=2,
                   help="pin every trainer to the same N CPUs; N threads for torch, BLAS, OpenMP and Numba")
    p.add_argument("--skip", choices=["torch", "numpy", "hps"], action="append", default=[],
                   help="do not run this trainer (repeatable)")
    p.add_argument("--json", default=None, help="also write the results to this file")
    args = p.parse_args(argv)

    allowed = sorted(os.sched_getaffinity(0))
    if not 1 <= args.cores <= len(allowed):
        p.error(f"--cores must be in [1, {len(allowed)}] (the CPUs this process may use), got {args.cores}")
    cpus = allowed[:args.cores]
    # Thread pools read their sizes at import, and threads started there keep the old affinity:
    # pin, then re-run ourselves once with the sizes set (the affinity survives exec).
    if os.environ.get("_HPS_PEER_REEXEC") != "1":
        os.sched_setaffinity(0, cpus)
        n = str(args.cores)
        env = dict(os.environ, OPENBLAS_NUM_THREADS=n, OMP_NUM_THREADS=n, MKL_NUM_THREADS=n,
                   NUMBA_NUM_THREADS=n, _HPS_PEER_REEXEC="1")
        os.execve(sys.executable, [sys.executable, "-m", "bench.peer_torch", *(argv or sys.argv[1:])], env)

    with tempfile.TemporaryDirectory(prefix="peer-torch-") as tmp:
        if args.data == "criteo" and args.criteo_file is None:
            from bench.train_scaling import write_criteo

            args.criteo_file = str(write_criteo(Path(tmp) / "criteo.txt", args.rows, seed=1))
            args.criteo_eval = str(write_criteo(Path(tmp) / "criteo-eval.txt", max(1, args.rows // 10), seed=2))
        elif args.data == "criteo" and args.criteo_eval is None:
            p.error("--criteo-file needs --criteo-eval")
        return _compare(args, cpus)


def _compare(args, cpus) -> int:
    train, ev, nf, nd, note = _load(args)
    cfg = ModelConfig(n_fields=nf, emb_dim=args.embedding_dim, n_dense=nd, hidden=_widths(args.hidden),
                      seed=args.seed, model=args.model, cross_layers=args.cross_layers,
                      bottom_mlp=_widths(args.bottom_mlp) or None, sparse_optimizer=args.sparse_optimizer,
                      dense_optimizer=args.dense_optimizer, emb_l2=args.emb_l2, sparse_lr=args.sparse_lr,
                      dense_lr=args.dense_lr, adagrad_initial_accumulator=args.adagrad_init)
    vocab = build_vocab(train, ev)
    n_train = sum(len(b) for b in train)
    print(f"--model {args.model}, rows {args.sparse_optimizer}, dense {args.dense_optimizer}; {note}; "
          f"{n_train} train / {sum(len(b) for b in ev)} eval examples, {vocab.shape[0]} keys, "
          f"mini-batch {args.minibatch_size}, {args.epochs} epoch(s), pinned to CPUs {cpus}")
    results = {}
    if "hps" not in args.skip:
        results["hps"] = train_hps(args)
    if "numpy" not in args.skip:
        results["numpy_reference"] = train_numpy_reference(train, ev, cfg, args.epochs, vocab=vocab)
    if "torch" not in args.skip:
        import torch

        results["torch"] = train_torch(train, ev, cfg, args.epochs, threads=args.cores, vocab=vocab)
        results["torch"]["version"] = torch.__version__
    for name, r in results.items():
        r["examples_per_core_sec"] = r["examples_per_sec"] / r["busy_cores"]
        print(f"{name:16s} AUC {r['auc']:.4f}  logloss {r['logloss']:.4f}  "
              f"{r['examples_per_sec']:,.0f} examples/s  ({r['train_seconds']:.1f} s)  "
              f"{r['busy_cores']:.2f} cores busy  {r['examples_per_core_sec']:,.0f} examples/s per core")
    if "torch" in results:
        t = results["torch"]
        for name in ("hps", "numpy_reference"):
            if name in results:
                r = results[name]
                results[f"ratio_{name}_over_torch"] = r["examples_per_sec"] / t["examples_per_sec"]
                results[f"per_core_ratio_{name}_over_torch"] = r["examples_per_core_sec"] / t["examples_per_core_sec"]
                print(f"{name} / torch: examples/s {results[f'ratio_{name}_over_torch']:.2f}x, per core "
                      f"{results[f'per_core_ratio_{name}_over_torch']:.2f}x;  "
                      f"AUC diff {r['auc'] - t['auc']:+.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(args=vars(args), cpus=cpus, **results), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
