"""The CUDA table's lookups, kernel against call: for each dim, the device time of the ``get`` and
``contains`` kernels alone (CUDA events around ten queued ``get_async`` / ``contains_async`` calls on
device arrays) beside
the wall time of the blocking ``HashTable.get(keys, out=)`` / ``contains(keys)`` (what
``shared/device/table_bench.py`` times), so the difference is the per-call fixed cost. HKV-style workload:
batches of 2^20 uint64 keys, 2^26 slots at load 0.5 (``--small``: 2^16 keys, 2^18 slots).

    python -m bench.table_cuda_calls [--small] [--out FILE.json]      # needs a CUDA GPU and CuPy

Prints one JSON line per dim: B-KV/s (1e9 keys/s), median of 20 calls after a warm-up.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from hps._argparse import ArgumentParser


def _mix(cp, i):
    """splitmix64's finalizer (a bijection on uint64: distinct i, distinct keys)."""
    x = i.astype(cp.uint64) * cp.uint64(0x9E3779B97F4A7C15)
    x ^= x >> cp.uint64(30)
    x *= cp.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> cp.uint64(27)
    x *= cp.uint64(0x94D049BB133111EB)
    return x ^ (x >> cp.uint64(31))


def _median_rate(n: int, seconds: list[float]) -> float:
    return n / float(np.median(seconds)) / 1e9


def case(cp, dim: int, log2_keys: int, log2_slots: int, reps: int = 20) -> dict:
    from hps import HashTable

    b, slots = 1 << log2_keys, 1 << log2_slots
    t = HashTable(slots // 2, dim, device="cuda", max_load_factor=0.5)
    ones = cp.ones((b, dim), cp.float32)
    for a in range(0, slots // 2, b):
        t.insert(_mix(cp, cp.arange(a + 1, min(a + b, slots // 2) + 1)), ones[:min(b, slots // 2 - a)])
    keys = _mix(cp, cp.random.default_rng(7).integers(1, slots // 2 + 1, b))
    out, found = cp.empty((b, dim), cp.float32), cp.empty(b, cp.bool_)
    start, end = cp.cuda.Event(), cp.cuda.Event()

    def kernel(fn, queued: int = 10) -> float:
        """Device time of one launch: ``queued`` launches back to back between two events, so the
        host's time to issue each hides behind the kernels before it."""
        fn()
        ts = []
        for _ in range(reps):
            start.record()
            for _ in range(queued):
                fn()
            end.record()
            end.synchronize()
            ts.append(cp.cuda.get_elapsed_time(start, end) / 1e3 / queued)
        return _median_rate(b, ts)

    def call(fn) -> float:
        fn()
        cp.cuda.runtime.deviceSynchronize()
        ts = []
        for _ in range(reps):
            s = time.perf_counter()
            fn()
            cp.cuda.runtime.deviceSynchronize()
            ts.append(time.perf_counter() - s)
        return _median_rate(b, ts)

    return {"dim": dim, "keys": b, "slots": t.n_slots,
            "get_kernel": kernel(lambda: t.get_async(keys, out, found)),
            "get_call": call(lambda: t.get(keys, out=out)),
            "contains_kernel": kernel(lambda: t.contains_async(keys, found)),
            "contains_call": call(lambda: t.contains(keys))}


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.table_cuda_calls", description=__doc__.split("\n\n")[0])
    p.add_argument("--small", action="store_true", help="2^16 keys, 2^18 slots (a quick proof run)")
    p.add_argument("--out", default=None, help="also write the figures to this JSON file")
    a = p.parse_args(argv)
    import cupy as cp

    res = [case(cp, dim, 16 if a.small else 20, 18 if a.small else 26) for dim in (8, 32, 64)]
    for r in res:
        print(json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
