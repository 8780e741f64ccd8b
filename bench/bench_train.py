"""End-to-end training benchmarks of ``python -m hps.train`` (each writes JSON under bench/results/).

    python -m bench.bench_train outofcore   # a --mem-budget caching 10 % of the table vs everything in memory
    python -m bench.bench_train scaling     # per-rank work at 1, 2, 4, 8 MPI ranks (bench/train_scaling.py)
    python -m bench.bench_train scale --rows 1800000 --embedding-dim 192
                                            # a table larger than free DRAM; peak RSS and examples/s

Each configuration runs as its own ``python -m hps.train`` process, back to back in the same run,
so the ratios compare like with like on this (noisy, 2-core) machine.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._jobs import train_command
from hps._argparse import ArgumentParser
from hps.config import PAGE_CACHE_MODES

RESULTS = Path(__file__).resolve().parent / "results"


def run_job(args: list[str], ranks: int = 1, env: dict | None = None) -> dict:
    """Run one training job in a child process (``env``: variables added to its environment); returns its
    metrics plus wall time and peak RSS."""
    with tempfile.TemporaryDirectory(prefix="hps-bench-") as tmp:
        metrics = Path(tmp) / "m.json"
        cmd = train_command(args, metrics, ranks)
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env} if env else None)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            raise SystemExit(f"job failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
        m = json.loads(metrics.read_text())
        m["memory_plan"] = next((x for x in proc.stdout.splitlines() if x.startswith("hps: budget")), None)
        m["wall_seconds"] = wall
        m["peak_rss_bytes"] = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024
        m["command"] = " ".join(cmd[cmd.index("-m"):] if ranks == 1 else cmd)
        for k in ("loss_per_batch", "cache_hit_rate_per_batch"):
            m.pop(k, None)
        return m


def save(name: str, payload: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    payload = dict(payload, date=datetime.date.today().isoformat(), machine=platform.machine(),
                   cores=os.cpu_count(), argv=" ".join(["python -m bench.bench_train", *sys.argv[1:]]))
    path = RESULTS / f"train-{name}.json"
    path.write_text(json.dumps(payload, indent=1))
    return path


def outofcore(a) -> None:
    from hps.train import Trainer
    from hps.cli import parse_config

    base = ["--rows", str(a.rows), "--vocab-per-field", "200000", "--batch-size", "4096", "--minibatch-size", "1024",
            "--ssd-page-cache", a.ssd_page_cache]
    mem = run_job(base)
    row_bytes = mem["ssd_bytes_written"] / max(mem["table_rows"], 1)  # every row was flushed once
    # the job's own plan: its other shares, and a MEM-PS tier that caches 10 % of the rows beside the
    # SSD-PS key index of the whole table
    probe = Trainer(parse_config([*base, "--no-progress"]), log=lambda *a, **k: None)
    try:
        budget = probe.plan.budget_for_cache_rows(int(0.10 * mem["table_rows"]), mem["table_rows"])
    finally:
        probe.close()
    spill = run_job([*base, "--mem-budget", str(budget)])
    ratio = spill["examples_per_sec"] / mem["examples_per_sec"]
    print(f"in memory:   {mem['examples_per_sec']:,.0f} examples/s, AUC {mem['auc']:.4f}, "
          f"table {mem['table_rows']} rows")
    print(f"10 % budget: {spill['examples_per_sec']:,.0f} examples/s, AUC {spill['auc']:.4f}, "
          f"hit rate {spill['cache_hit_rate']:.3f}, SSD read {spill['ssd_bytes_read'] / 2**20:.0f} MiB")
    print(f"out-of-core / in-memory examples/s: {ratio:.2f}x (target >= 0.8x); bytes/row {row_bytes:.0f}")
    print("saved", save("outofcore", {"in_memory": mem, "budget_10pct": spill, "ratio": ratio,
                                      "budget_bytes": budget}))


def scaling(a) -> None:
    from .train_scaling import scaling as sweep

    print("saved", save("scaling", sweep(a)))  # the table is printed; bench/run_all.sh tees it to .txt


def scale(a) -> None:
    args = ["--rows", str(a.rows), "--fields", str(a.fields), "--vocab-per-field", str(a.vocab_per_field),
            "--zipf", str(a.zipf), "--embedding-dim", str(a.embedding_dim), "--batch-size", "8192",
            "--minibatch-size", "4096", "--hidden", "64,32", "--mem-budget", a.mem_budget,
            "--rows-per-file", str(a.rows_per_file), "--ssd-page-cache", a.ssd_page_cache]
    args += ["--ssd-path", a.ssd_path] if a.ssd_path else []
    m = run_job(args)
    row_bytes = 4 * 2 * a.embedding_dim
    table_gb = m["table_rows"] * row_bytes / 1e9
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 1e9
    fetched = m["ssd_rows_loaded"] * row_bytes
    print(m["memory_plan"])
    print(f"rows {m['table_rows']:,} x {row_bytes} B = {table_gb:.1f} GB table; peak RSS "
          f"{m['peak_rss_bytes'] / 1e9:.1f} GB; {m['examples_per_sec']:,.0f} examples/s (target >= 4x 2,955); "
          f"disk {m['ssd_disk_bytes'] / 1e9:.1f} GB; SSD read {m['ssd_bytes_read'] / 1e9:.1f} GB = "
          f"{m['ssd_bytes_read'] / max(fetched, 1):.2f}x the rows fetched (target <= 3x); "
          f"AUC {m.get('auc', float('nan')):.4f}")
    print("saved", save("scale", {"metrics": m, "table_gb": table_gb, "row_bytes": row_bytes,
                                  "available_dram_gb_after": avail}))


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.bench_train", description=__doc__.split("\n\n")[0])
    p.add_argument("which", choices=["outofcore", "scaling", "scale"])
    p.add_argument("--rows", type=int, default=None, help="examples (scaling: lines per part) "
                   "(400000; scaling 200000)")
    p.add_argument("--fields", type=int, default=16)
    p.add_argument("--vocab-per-field", type=int, default=50_000_000)
    p.add_argument("--zipf", type=float, default=0.9)
    p.add_argument("--embedding-dim", type=int, default=None, help="(scale 64; scaling 16)")
    p.add_argument("--mem-budget", default="8GB")
    p.add_argument("--rows-per-file", type=int, default=65_536)
    p.add_argument("--ssd-path", help="SSD-PS root (default: a new temporary directory per run)")
    g = p.add_argument_group("scaling")
    g.add_argument("--ranks", default="1,2,4,8", help="scaling: rank counts")
    g.add_argument("--batch-size", type=int, default=16384, help="scaling: global batch (strong; weak: x N)")
    g.add_argument("--minibatch-size", type=int, default=2048, help="scaling: global mini-batch")
    g.add_argument("--hidden", default="128,64", help="scaling: MLP hidden sizes")
    g.add_argument("--sparse-sync", default="owner", help="scaling: owner or allreduce")
    g.add_argument("--epochs", type=int, default=1, help="scaling: epochs over the data (more work per process)")
    g.add_argument("--cores-per-rank", type=int, default=0,
                   help="scaling: pin each rank to its own this many CPUs (0: unpinned) and report wall-clock speedup")
    g.add_argument("--no-weak", dest="weak", action="store_false", help="scaling: strong scaling only")
    g.add_argument("--work-dir", default=None, help="scaling: where the generated data goes (a temp dir)")
    p.add_argument("--ssd-page-cache", default="direct", choices=PAGE_CACHE_MODES)
    a = p.parse_args(argv)
    if a.rows is None:
        a.rows = 200_000 if a.which == "scaling" else 400_000
    if a.embedding_dim is None:
        a.embedding_dim = 16 if a.which == "scaling" else 64
    {"outofcore": outofcore, "scaling": scaling, "scale": scale}[a.which](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
