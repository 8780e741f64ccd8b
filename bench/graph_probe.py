"""What a CUDA graph of the train step's dense part would save on a GPU: hps's eager pass against a replayed
graph of the same work, alone and beside a thread running Python (#24; a probe for a lent GPU).

On an H200 (``bench/results/gpu-h200-2026-11-28``) the train stage of the issue's job took ~4.5 ms a
mini-batch at 4,096 and at 16,384 examples alike: a cost per call (cuBLAS products, CuPy operations, each
handing the GIL back beside the prepare and place threads), not per example. Replaying the network's
forward, backward and dense step as one CUDA graph would make it one launch, but CuPy 14.2 refuses cuBLAS
calls during stream capture (cupy/cupy#6290), so hps cannot capture its own pass yet. Before building
that (a cuBLAS handle of hps's own, or hand-written products), this measures the prize:

- ``hps-eager``: hps's pass as the train stage runs it on the pooled input: ``FieldModel.
  forward_backward_pooled`` (the loss kernel ``bce_loss_grad_async`` between forward and backward) and
  ``DenseAdam.step`` over the flat parameters (13 CuPy operations);
- ``torch-eager`` and ``torch-graph``: the same MLP, loss, input gradient and Adam in PyTorch, eagerly
  and captured once (``torch.cuda.CUDAGraph``, Adam ``capturable=True``) and replayed: one launch a step;

each as host microseconds a step (``--steps`` steps, then one synchronisation; the median of
``--repeats``), alone (``quiet``) and beside a thread running Python (``python``) at the GIL switch interval
``--device cuda`` uses (0.001 s).

    python -m bench.graph_probe [--minibatch 4096] [--steps 200] [--out FILE.json]   # needs a GPU, CuPy, torch

Not yet run on a GPU (written 2026-11-28 after the H200 was given back).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from hps._argparse import ArgumentParser

from . import _beside
from ._jobs import write_result


def _timed(step, steps: int, repeats: int, sync) -> float:
    """Median host microseconds a step over ``repeats`` runs of ``steps`` steps (each ends synchronised)."""
    for _ in range(10):
        step()
    sync()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        out.append(1e6 * (time.perf_counter() - t) / steps)
    return statistics.median(out)


def hps_step(a):
    """hps's eager dense part of one mini-batch (module docstring), and a synchronisation."""
    import cupy as cp
    import numpy as np

    from hps.gpu import BatchScalars, bce_loss_grad_async
    from hps.model import CTRModel, DenseAdam

    model = CTRModel(a.fields, a.dim, n_dense=a.dense, hidden=a.hidden, xp=cp)
    opt, scalars = DenseAdam(1e-3), BatchScalars()
    rng = cp.random.default_rng(0)
    pooled = rng.standard_normal((a.minibatch, a.fields * model.row_params), dtype=np.float32)
    dense = rng.standard_normal((a.minibatch, a.dense), dtype=np.float32)
    labels = (rng.random(a.minibatch) < 0.3).astype(np.float32)

    def loss_grad(z):
        dz = cp.empty_like(z)
        bce_loss_grad_async(z, labels, a.minibatch, dz, scalars.loss)
        return dz

    def step():
        _, grads = model.forward_backward_pooled(pooled, dense, loss_grad)
        opt.step(model.params, grads)

    return step, cp.cuda.get_current_stream().synchronize


def torch_steps(a):
    """(eager step, graph replay, synchronise) of the same work in PyTorch."""
    import torch
    from torch import nn

    dev = torch.device("cuda")
    widths = [a.fields * a.dim + a.dense, *a.hidden]
    layers = []
    for i in range(len(widths) - 1):
        layers += [nn.Linear(widths[i], widths[i + 1]), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(widths[-1], 1)).to(dev)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, capturable=True)
    x = torch.randn(a.minibatch, widths[0], device=dev, requires_grad=True)
    y = (torch.rand(a.minibatch, 1, device=dev) < 0.3).float()
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")

    def step():
        opt.zero_grad(set_to_none=False)
        x.grad = None
        (loss_fn(net(x), y) / a.minibatch).backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)   # the capture's backward allocates the gradients, which replays overwrite
    x.grad = None
    with torch.cuda.graph(graph):
        (loss_fn(net(x), y) / a.minibatch).backward()
        opt.step()
    return step, graph.replay, torch.cuda.synchronize


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.graph_probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--minibatch", type=int, default=4096)
    p.add_argument("--fields", type=int, default=26)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--dense", type=int, default=13)
    p.add_argument("--hidden", default="512,256")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="also write the figures to this JSON file (with the command)")
    a = p.parse_args(argv)
    a.hidden = tuple(int(h) for h in a.hidden.split(","))
    sys.setswitchinterval(0.001)  # --device cuda's (DeviceBackend.switch_interval)
    cases = {"hps-eager": hps_step(a)}
    t_eager, t_graph, t_sync = torch_steps(a)
    cases.update({"torch-eager": (t_eager, t_sync), "torch-graph": (t_graph, t_sync)})
    out = {"minibatch": a.minibatch, "hidden": list(a.hidden), "steps": a.steps, "us_per_step": {}}
    for cond, target in (("quiet", None), ("python", _beside.python_loop)):
        with _beside.beside(target):
            got = {name: round(_timed(step, a.steps, a.repeats, sync), 1) for name, (step, sync) in cases.items()}
        out["us_per_step"][cond] = got
        print(cond, json.dumps(got), flush=True)
    if a.out:
        write_result(a.out, "graph_probe", argv, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
