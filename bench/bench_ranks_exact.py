"""N ranks equal one process on a long run: ``mpiexec -n N python -m hps.train`` against
``python -m hps.train --data-shards N`` on a Criteo-format file of 600,000 lines (batch 16,384,
mini-batch 2,048, dim 16, MLP 256-128, Adam dense, one epoch: ~300 Adam steps), for each
``--sparse-sync`` and with spilling: each rank's HBM-PS cache holds a quarter of its share of the
table (rows go down to the MEM-PS and come back) and its ``--mem-budget`` is the smallest it accepts
with room for its share of the SSD-PS index (tests/budgets.py). The MEM-PS cache borrows the index's
room while the index is small, so whether rows come back from the SSD-PS during training depends on
the data: the run prints the SSD-PS bytes read (on this file, none: every rank's rows go down to the
SSD-PS only at the end; tests/test_train_mpi_order.py's spilling case reads rows back).

    python -m bench.bench_ranks_exact                       # every case, 4 ranks, 600,000 lines
    python -m bench.bench_ranks_exact --lines 100000 --cases owner spill --ranks 2
    python -m bench.bench_ranks_exact --out bench/results/ranks-exact.json

Prints, per case, the largest |difference| over the export (rows, first-order weights, dense
parameters) and both AUCs; the promise (DESIGN.md, "Reductions have a fixed order") is <= 1e-5 and
AUC equal to 4 decimals. ``--dense-sync easgd`` has no case: with one group it is the allreduce job
(tests/test_train_ht.py), and G > 1 groups, a dense copy each, have no one-process twin (one process
refuses ``--groups``); their rounds are checked against a serial EASGD (tests/mpi/check_easgd.py).
A correctness check that takes minutes, so it lives here, beside the benchmarks;
tests/test_train_mpi_order.py runs the same comparison on 60,000 lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hps._argparse import ArgumentParser

JOB = ["--format", "criteo", "--batch-size", "16384", "--minibatch-size", "2048", "--embedding-dim", "16",
       "--hidden", "256,128", "--dense-optimizer", "adam", "--epochs", "1", "--blas-threads", "1",
       "--no-progress"]
ROW_BYTES = 128   # a row of dim 16 and its Adagrad state, float32
MINIBATCHES_PER_BATCH = int(JOB[JOB.index("--batch-size") + 1]) // int(JOB[JOB.index("--minibatch-size") + 1])
CASES = {
    "owner": [],
    "allreduce": ["--sparse-sync", "allreduce"],
    "spill": [],   # the ranks get a --mem-budget and --hbm-budget below their share (_spill_flags)
}


def write_criteo(path: Path, n: int, seed: int = 0) -> Path:
    """A Criteo TSV file of ``n`` lines with a planted signal in 4 zipf-distributed fields, 22 more
    with a long tail (so the table grows with the lines, and a batch touches a small part of it), and uneven
    lines (the first half has its counts and most categoricals empty), after tests/test_train_mpi.py's
    ``criteo_file``; written a block at a time."""
    rng = np.random.default_rng(seed)
    weight = np.random.default_rng(seed + 1).standard_normal((4, 3000))
    with open(path, "w") as f:
        for lo in range(0, n, 50_000):
            m = min(50_000, n - lo)
            vals = np.minimum(rng.zipf(1.3, size=(m, 4)) - 1, 2999)
            p = 1 / (1 + np.exp(-(weight[np.arange(4), vals].sum(axis=1) - 0.5)))
            labels = (rng.random(m) < p).astype(int)
            # half a long zipf tail, half rare values: ~4 M keys at 600,000 lines
            rest = np.where(rng.random((m, 22)) < 0.5, np.minimum(rng.zipf(1.05, size=(m, 22)), 5_000_000),
                            rng.integers(5_000_000, 15_000_000, size=(m, 22)))
            ints = rng.integers(0, 10**6, size=(m, 13))
            full = np.arange(lo, lo + m) >= n // 2
            hexes = np.char.mod("%08x", np.concatenate([vals, rest], axis=1))
            counts = np.char.mod("%d", ints)
            rows = []
            for i in range(m):   # formatting a test file, not a hot path
                if full[i]:
                    rows.append("\t".join([str(labels[i]), *counts[i], *hexes[i]]))
                else:
                    rows.append("\t".join([str(labels[i]), *[""] * 13, *hexes[i, :4], *[""] * 22]))
            f.write("\n".join(rows) + "\n")
    return path


def _spill_flags(argv: list[str], ranks: int, mpiexec: str, env: dict, table_rows: int) -> list[str]:
    """--mem-budget and --hbm-budget under which each rank's MEM-PS holds one batch's working set (the
    smallest budget every rank accepts, with room for its share of the SSD-PS index: the plan of
    tests/budgets.py, which the spilling tests use) and its HBM-PS cache a quarter of its share."""
    from tests.budgets import smallest_spill_budget

    share = max(1, table_rows // ranks)

    def run(budget):
        return subprocess.run([mpiexec, "-n", str(ranks), sys.executable, "-m", "hps.train", *argv,
                               "--mem-budget", str(budget), "--hbm-budget", str(1 << 30)],
                              capture_output=True, text=True, env=env)

    budget = smallest_spill_budget(run, 1.3 * share, ROW_BYTES)
    return ["--mem-budget", str(budget), "--hbm-budget", str(share // 4 * ROW_BYTES)]


def _run(cmd: list[str], env: dict, retry_hbm: bool = False) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``cmd`` to the end; with ``retry_hbm``, double its --hbm-budget while a batch's working set
    does not fit it (the smallest budget that holds every batch, from a quarter of the rows up)."""
    for _ in range(8):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if not (retry_hbm and proc.returncode != 0 and "more than the HBM-PS budget" in proc.stderr):
            break
        i = cmd.index("--hbm-budget") + 1
        cmd = [*cmd[:i], str(2 * int(cmd[i])), *cmd[i + 1:]]
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return proc, time.perf_counter() - t0


def main(argv=None) -> int:
    from hps.train import load_export
    from tests.test_train_mpi import export_diff

    ap = ArgumentParser(description=__doc__.split("\n\n")[0], error_prefix="bench_ranks_exact")
    ap.add_argument("--lines", type=int, default=600_000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    results = {}
    with tempfile.TemporaryDirectory(prefix="hps-ranks-exact-") as tmp:
        tmp = Path(tmp)
        data = write_criteo(tmp / "train.txt", args.lines)
        for case in args.cases:
            flags = [*JOB, "--data", str(data), "--eval-data", str(data), *CASES[case]]
            one, ranks = tmp / f"{case}-one", tmp / f"{case}-ranks"
            _, t1 = _run([sys.executable, "-m", "hps.train", *flags, "--data-shards", str(args.ranks),
                          "--export", str(one), "--metrics-out", f"{one}.json"], env)
            m1 = json.loads(Path(f"{one}.json").read_text())
            rank_flags = flags
            if case == "spill":
                rank_flags = flags + _spill_flags(flags, args.ranks, args.mpiexec, env, m1["table_rows"])
            cmd = [args.mpiexec, "-n", str(args.ranks), sys.executable, "-m", "hps.train", *rank_flags,
                   "--export", str(ranks), "--metrics-out", f"{ranks}.json"]
            _, tn = _run(cmd, env, retry_hbm="--hbm-budget" in rank_flags)
            mn = json.loads(Path(f"{ranks}.json").read_text())
            diff = export_diff(load_export(one, first_order=True), load_export(ranks, first_order=True))
            spilled = sum(mn.get("ssd_bytes_read_per_rank", [0]))
            ok = diff <= 1e-5 and round(m1["auc"], 4) == round(mn["auc"], 4)
            results[case] = {"max_abs_diff": diff, "auc_one": m1["auc"], "auc_ranks": mn["auc"], "ok": ok,
                             "steps": len(m1["loss_per_batch"]) * MINIBATCHES_PER_BATCH, "ssd_bytes_read": spilled,
                             "seconds_one": t1, "seconds_ranks": tn}
            print(f"{case:10s} max|diff| {diff:.3g}  AUC {m1['auc']:.5f} (one process) vs {mn['auc']:.5f} "
                  f"({args.ranks} ranks)  ssd read {spilled:,} B  {t1:.0f} s / {tn:.0f} s  "
                  f"{'ok' if ok else 'DIFFERS'}", flush=True)
    if args.out:
        from bench._jobs import write_result

        write_result(args.out, "bench_ranks_exact", argv or sys.argv[1:],
                     {"lines": args.lines, "ranks": args.ranks, "cases": results})
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
