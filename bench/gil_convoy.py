"""What a C call that hands the GIL back costs beside a thread running Python: the mechanism behind
``hps._driver_launch``'s ``driver-gil`` mode, measurable on any machine (no GPU).

    python -m bench.gil_convoy [--calls 300] [--out FILE.json]

A ctypes call through ``CDLL`` releases the GIL for the call's duration (as Numba's, ``cuda.core``'s and
CuPy's driver calls do); through ``PyDLL`` it keeps it. The call here is ``usleep(5)`` (tens of
microseconds with the kernel's timer slack, about a kernel launch's order). Alone, both cost the call.
Beside a thread running Python, the other thread takes the GIL while the call runs, and the caller gets it
back only when that thread is made to drop it: one GIL switch interval (``sys.setswitchinterval``) per
call. Reports the median and mean microseconds per call, quiet and beside a busy thread, at switch
intervals of 0.005 s (Python's) and 0.001 s (hps's on ``--device cuda``).
"""

from __future__ import annotations

import ctypes
import statistics
import sys
import time

from hps._argparse import ArgumentParser

from . import _beside
from ._jobs import write_result


def _per_call(fn, n: int) -> dict:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(5)
        ts.append(time.perf_counter() - t0)
    return {"median_us": round(1e6 * statistics.median(ts), 1), "mean_us": round(1e6 * statistics.mean(ts), 1)}


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.gil_convoy", description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=300, help="calls per case (default 300)")
    p.add_argument("--out", default=None, help="also write the figures here (JSON)")
    a = p.parse_args(argv)
    calls = {"releases GIL (CDLL)": ctypes.CDLL(None).usleep, "holds GIL (PyDLL)": ctypes.PyDLL(None).usleep}
    before = sys.getswitchinterval()
    out = {}
    try:
        for interval in (0.005, 0.001):
            sys.setswitchinterval(interval)
            for beside in ("quiet", "busy Python thread"):
                with _beside.beside(None if beside == "quiet" else _beside.python_loop):
                    case = {name: _per_call(fn, a.calls) for name, fn in calls.items()}
                out[f"switch {interval}, {beside}"] = case
                print(f"switch interval {interval} s, {beside}: "
                      + "; ".join(f"{k} median {v['median_us']} us, mean {v['mean_us']} us" for k, v in case.items()),
                      flush=True)
    finally:
        sys.setswitchinterval(before)
    if a.out:
        write_result(a.out, "gil_convoy", argv, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
