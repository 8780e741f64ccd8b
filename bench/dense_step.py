"""The dense optimizer's step over a model's dense tensors laid out as views of one buffer (``hps/model/_flat.py``:
one pass over the buffer) against the same tensors as separate arrays (one pass per tensor), host thread
time per step, A B A B; the parameters after the timed steps must be equal bit for bit.

    python -m bench.dense_step [--steps 1000] [--optimizer adam|adagrad|sgd]

Shapes: the MLP of issue #25's criteo job (26 x 16 + 13 inputs, 256-128) and of issue #24's GPU job
(26 x 32 + 4 inputs, 512-256).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from hps._argparse import ArgumentParser
from hps.model import DenseAdagrad, DenseAdam, DenseSGD, flat_views

SHAPES = {
    "criteo (#25)": {"W0": (429, 256), "b0": (256,), "W1": (256, 128), "b1": (128,), "W2": (128, 1), "b2": (1,)},
    "device job (#24)": {"W0": (836, 512), "b0": (512,), "W1": (512, 256), "b1": (256,), "W2": (256, 1), "b2": (1,)},
}
OPTIMIZERS = {"adam": lambda: DenseAdam(1e-3), "adagrad": lambda: DenseAdagrad(0.01), "sgd": lambda: DenseSGD(0.01)}


def _time(shapes: dict, one_buffer: bool, make_opt, steps: int) -> tuple[float, dict]:
    """(thread-time microseconds a step, the parameters after the steps)."""
    rng = np.random.default_rng(0)
    if one_buffer:
        params, grads = flat_views(np, shapes, np.float32), flat_views(np, shapes, np.float32)
    else:
        params = {k: np.empty(s, np.float32) for k, s in shapes.items()}
        grads = {k: np.empty(s, np.float32) for k, s in shapes.items()}
    for k, s in shapes.items():
        params[k][...] = rng.standard_normal(s)
        grads[k][...] = rng.standard_normal(s) * 1e-2
    opt = make_opt()
    for _ in range(10):
        opt.step(params, grads)
    c = time.thread_time()
    for _ in range(steps):
        opt.step(params, grads)
    return (time.thread_time() - c) / steps * 1e6, params


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m bench.dense_step", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
    args = ap.parse_args(argv)
    for name, shapes in SHAPES.items():
        n = sum(int(np.prod(s)) for s in shapes.values())
        times: dict = {False: [], True: []}
        for _ in range(2):
            for one in (False, True):
                us, params = _time(shapes, one, OPTIMIZERS[args.optimizer], args.steps)
                times[one].append(us)
                if one:
                    same = all(np.array_equal(params[k], last[k]) for k in shapes)
                    if not same:
                        print(f"{name}: the two layouts stepped to different parameters", file=sys.stderr)
                        return 1
                last = params
        per, flat = times[False], times[True]
        print(f"{name}, {n:,} parameters, {args.optimizer}: one buffer "
              f"{', '.join(f'{t:.0f}' for t in flat)} us a step against {', '.join(f'{t:.0f}' for t in per)} tensor "
              f"by tensor (ratio {', '.join(f'{f / p:.2f}' for f, p in zip(flat, per))}); same bits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
