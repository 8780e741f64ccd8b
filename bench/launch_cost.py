"""The host's cost of one kernel launch, alone and beside a busy thread: what the train stage of
``--device cuda`` pays per launch. An H200 profile of the issue's job (2026-11-27 night,
``bench/results/gpu-h200-2026-11-27-night``) put ~0.5 ms of the train thread's wall in each Numba launch
inside the pipeline, against 0.07-0.16 ms for a whole blocking table call measured alone; this separates
the candidates.

    python -m bench.launch_cost [--launches 1000] [--out FILE.json]     # needs a CUDA GPU and CuPy

Cases, each the median microseconds of host time per launch over ``--launches`` launches of a kernel
that does almost nothing (one thread writes one element), on the legacy default stream:

- ``<mode>-<k>``: ``hps._launch.launch`` of a Numba kernel with k device-array arguments (1, 4, 8: the
  train step's kernels take 4-9), CuPy arrays viewed once before the loop, in each launch mode of
  ``hps._driver_launch`` (``numba``: Numba's launch; ``driver``: one ``cuLaunchKernel`` through ctypes,
  the GIL released in the call; ``driver-gil``: the same holding the GIL);
- ``<mode>-8-views``: the same with the 8 CuPy arrays viewed at every launch (``hps._launch.arg``, as the
  ``hps.gpu`` operations do);
- ``cupy``: a CuPy elementwise kernel on a one-element array;

each alone (``quiet``), beside a thread running Python (``python``), beside a thread making blocking
CUDA calls (``sync``: a 4-byte device-to-host copy in a loop), and beside the Python thread at a GIL
switch interval of 0.0002 s (``python-0.0002``).
"""

from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

from hps._argparse import ArgumentParser

from . import _beside
from ._jobs import write_result


def _busy_sync(stop: threading.Event, cp) -> None:
    a = cp.zeros(1, cp.int32)
    while not stop.is_set():
        a.get()


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.launch_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=1000)
    p.add_argument("--out", default=None, help="also write the figures here (JSON)")
    a = p.parse_args(argv)
    import cupy as cp
    from numba import cuda

    from hps import _driver_launch as D
    from hps import _launch as L

    @cuda.jit
    def touch1(x):
        if cuda.grid(1) == 0:
            x[0] += 1

    @cuda.jit
    def touch4(x, b, c, d):
        if cuda.grid(1) == 0:
            x[0] += b[0] + c[0] + d[0]

    @cuda.jit
    def touch8(x, b, c, d, e, f, g, h):
        if cuda.grid(1) == 0:
            x[0] += b[0] + c[0] + d[0] + e[0] + f[0] + g[0] + h[0]

    arrays = [cp.zeros(4096, cp.float32) for _ in range(8)]
    views = [L.arg(x, "x") for x in arrays]
    grid = L.grid1(1)
    add = cp.ElementwiseKernel("float32 x", "float32 y", "y = x + 1", "hps_launch_cost_add")
    one = cp.zeros(1, cp.float32)
    calls = {}  # name -> (launch mode or None, one launch)
    for m in D.MODES:
        calls[f"{m}-1"] = m, lambda: L.launch(touch1, grid, 0, views[0])
        calls[f"{m}-4"] = m, lambda: L.launch(touch4, grid, 0, *views[:4])
        calls[f"{m}-8"] = m, lambda: L.launch(touch8, grid, 0, *views)
        calls[f"{m}-8-views"] = m, lambda: L.launch(touch8, grid, 0, *[L.arg(x, "x") for x in arrays])
    calls["cupy"] = None, lambda: add(one, one)

    def per_launch(m, fn) -> float:
        if m is not None:
            D.set_mode(m)
        fn()  # the first launch in a mode may compile (through Numba), the second run the driver path's probe
        fn()
        if m is not None and D.mode() != m:
            raise SystemExit(f"launch mode {m} fell back to {D.mode()} (its probe failed: see the warning)")
        cp.cuda.Device().synchronize()
        ts = []
        for _ in range(a.launches):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        cp.cuda.Device().synchronize()
        return 1e6 * float(np.median(ts))

    out = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "launches": a.launches, "us": {}}
    for beside in ("quiet", "python", "sync", "python-0.0002"):
        target = {"quiet": None, "sync": _busy_sync}.get(beside, _beside.python_loop)
        before = sys.getswitchinterval()
        if beside == "python-0.0002":
            sys.setswitchinterval(0.0002)
        try:
            with _beside.beside(target, *((cp,) if beside == "sync" else ())):
                out["us"][beside] = {name: per_launch(m, fn) for name, (m, fn) in calls.items()}
        finally:
            sys.setswitchinterval(before)
        print(beside, json.dumps({k: round(v, 1) for k, v in out["us"][beside].items()}), flush=True)
    if a.out:
        write_result(a.out, "launch_cost", argv, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
