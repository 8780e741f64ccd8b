"""The MEM-PS under an HBM-PS cache's churn: each round ``take``s a batch of resident keys drawn at random
(the misses a device cache fetches) and ``push``-es their rows back (its evictions: keys the MEM-PS no
longer holds), on a cache of ``--resident`` rows. Prints the thread CPU nanoseconds a row of each, after
one warm-up round (the pattern of a job whose ``--hbm-budget`` holds a tenth of the table).

    python -m bench.memps_churn [--resident 4000000] [--batch 70000] [--rounds 40] [--row-width 64]
"""

from __future__ import annotations

import sys
import tempfile
import time

import numpy as np

from hps._argparse import ArgumentParser
from hps.mem import MemPS, RowInitializer
from hps.ssd import SSDStore


def main(argv=None) -> int:
    ap = ArgumentParser(prog="python -m bench.memps_churn", description=__doc__.split("\n\n")[0])
    ap.add_argument("--resident", type=int, default=4_000_000)
    ap.add_argument("--batch", type=int, default=70_000)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--row-width", type=int, default=64)
    args = ap.parse_args(argv)
    W, R, B = args.row_width, args.resident, args.batch
    rng = np.random.default_rng(0)
    keys = rng.permutation(R).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(1)
    with tempfile.TemporaryDirectory() as d:
        mem = MemPS(SSDStore(d + "/s", W), W, capacity_rows=2 * R, initializer=RowInitializer(W // 2, W, seed=1))
        rows = np.ones((B, W), np.float32)
        for a in range(0, R, B):
            mem.push(keys[a:a + B], rows[:keys[a:a + B].shape[0]], unpin=False, distinct=True)
        out = np.empty((B, W), np.float32)
        c_take = c_push = 0.0
        for r in range(-1, args.rounds):
            if r == 0:
                c_take = c_push = 0.0
            k = np.unique(keys[rng.integers(0, R, B + B // 8)])[:B]   # resident keys drawn at random
            rng.shuffle(k)
            c0 = time.thread_time()
            mem.take(k, out=out[:k.shape[0]])
            c1 = time.thread_time()
            mem.push(k, out[:k.shape[0]], unpin=False, distinct=True, absent=True)   # as the HBM-PS's write-back
            c_take += c1 - c0
            c_push += time.thread_time() - c1
    n = args.rounds * B
    print(f"take {c_take / n * 1e9:.0f} ns a row, push {c_push / n * 1e9:.0f} ns a row (thread CPU; {R:,} rows "
          f"resident, batches of {B:,}, rows of {W} float32)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
