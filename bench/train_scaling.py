"""``python -m bench.bench_train scaling``: how the work of ``python -m hps.train`` divides over N ranks.

Every configuration runs as ``mpiexec -n N`` with each rank under ``bench.rank_time`` (wall, whole-job CPU
seconds and peak RSS per rank; with ``--cores-per-rank K`` each rank pinned to its own K CPUs), on a
Criteo-format file generated once (``--rows`` lines per part):

- **strong** scaling: one file, the same global batch and mini-batch at every N;
- **weak** scaling: N files (one more part per rank), global batch and mini-batch N times larger.

Every job evaluates on one more generated file (a tenth of ``--rows``). A 1-rank job on the first
1,000 lines (``fixed``) measures what every process spends whatever its share of the data (Python
and library imports, MPI start, loading the cached Numba kernels): the report also gives whole-job
CPU minus N times that. Every job imports hps from bytecode compiled once before the sweep (``compileall``
into the package's ``__pycache__``, where Numba's kernel cache already is, as an installed package has its
``.pyc`` files): under ``PYTHONDONTWRITEBYTECODE`` every process would otherwise compile hps's ~150 modules
from source again, about 0.3 CPU s of each process's fixed cost that an installed job does not pay.

From each job's metrics (``--metrics-out``: per rank, CPU seconds of each stage outside MPI — its thread's
and, for the train stage, the dense pass's helper threads' —
bytes sent by kind) the benchmark models the time of a job whose ranks each have their own cores and
a link of bandwidth W, since a 2-core development machine cannot run N ranks side by side:

    T(N) = max over ranks of the busiest stage's CPU seconds + max over ranks of bytes sent / W

(the 4-stage pipeline overlaps its stages, so the busiest one sets the pace; W = 100 Gb/s, the
paper's RDMA class, and 10 Gb/s). Strong-scaling speedup is T(1) / T(N), weak-scaling speedup
N · T(1) / T(N). Targets (docs/benchmarks.md, "Scaling"): strong speedup >= 3.5 at 4 ranks and >= 6.5 at
8, whole-job CPU of 4 ranks <= 1.25x that of 1 rank, peak RSS per rank falling with N. The ``floor``
column is the least whole-job CPU ratio possible with this data when every process still pays the fixed
cost: with a job of a few CPU seconds it sits above 1.25 at 4 ranks, whatever the training step does.
``ms/mb`` is the busiest rank's train-stage CPU per global mini-batch and ``+ms/mb`` what it exceeds
the 1-rank job's divided by N (the cost per mini-batch that does not divide over the ranks).

On a machine with the cores (``--cores-per-rank 2`` on 16 cores runs up to 8 ranks side by side) the
wall clock is measured rather than modeled: ``wall`` is the slowest rank's, ``x wall`` the speedup over
the smallest N (weak: N times the work). Targets there: >= 3.4x at 4 ranks and >= 6x at 8.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

#: Link bandwidths of the model, bits per second.
BANDWIDTHS = {"100Gb/s": 100e9, "10Gb/s": 10e9}


def write_criteo(path: Path, lines: int, seed: int) -> Path:
    """A Criteo-format file: 13 counts (some missing), 26 categoricals of Zipf-like popularity, labels
    from a planted logistic model over the first 8 fields."""
    rng = np.random.default_rng(seed)
    vocab = np.array([10, 100, 1000, 10_000, 100_000] * 6)[:26]
    cats = np.minimum(rng.zipf(1.2, size=(lines, 26)) - 1, vocab - 1)
    w = np.random.default_rng(99).standard_normal((8, 100_000)) * 0.5
    logit = w[np.arange(8), cats[:, :8]].sum(axis=1) - 1.0
    labels = (rng.random(lines) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    counts = rng.integers(0, 500, size=(lines, 13))
    missing = rng.random((lines, 13)) < 0.2
    with open(path, "w") as f:
        for a in range(0, lines, 20_000):  # vectorised per block: one string per column, then rows
            b = min(lines, a + 20_000)
            cols = [labels[a:b].astype(str)]
            cols += [np.where(missing[a:b, j], "", counts[a:b, j].astype(str)) for j in range(13)]
            cols += [np.char.mod("%08x", (cats[a:b, j] * 2654435761 + j) % (1 << 32)) for j in range(26)]
            f.write("\n".join("\t".join(row) for row in zip(*cols)) + "\n")
    return path


def job_env() -> dict:
    """The jobs' environment (one BLAS/OpenMP thread per rank), after compiling hps's bytecode once,
    outside every measured process (see the module docstring)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    package = Path(__import__("hps").__file__).parent
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(package)], env=env, check=True)
    return env


def minibatches(examples: int, batch: int, minibatch: int) -> int:
    """Global mini-batches of one epoch of ``examples``: every batch cut into mini-batches, the last
    one of each batch shorter."""
    full, rest = divmod(examples, batch)
    return full * math.ceil(batch / minibatch) + math.ceil(rest / minibatch)


def run_ranks(n: int, args: list[str], work: Path, env: dict, cores_per_rank: int = 0) -> dict:
    """``mpiexec -n n`` of ``python -m hps.train args``, each rank under ``bench.rank_time`` (pinned to its
    own ``cores_per_rank`` CPUs when > 0) -> metrics with ``time_per_rank`` (wall, user, sys seconds and max
    RSS bytes of every rank)."""
    mpiexec = Path(sys.executable).parent / "mpiexec"
    metrics = work / f"m-{n}.json"
    cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(n), sys.executable, "-m", "bench.rank_time",
           str(work / f"time-{n}"), str(cores_per_rank), "--",
           sys.executable, "-m", "hps.train", "--no-progress", "--metrics-out", str(metrics), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    m = json.loads(metrics.read_text())
    times = []
    for r in range(n):
        wall, user, sys_, rss = (work / f"time-{n}.{r}").read_text().split()[-4:]
        times.append({"wall": float(wall), "cpu": float(user) + float(sys_), "max_rss_bytes": int(rss) * 1024})
    m["time_per_rank"] = times
    m["command"] = " ".join(["mpiexec", "-n", str(n), "python -m hps.train", *args])
    for k in ("loss_per_batch", "cache_hit_rate_per_batch"):
        m.pop(k, None)
    return m


def model(m: dict) -> dict:
    """Busiest stage CPU, most bytes sent and T(N) at each bandwidth of one job's metrics."""
    busiest = [max(c.values()) for c in m["stage_cpu_seconds"]]
    sent = [sum(b.values()) for b in m["bytes_sent_per_rank"]]
    out = {"busiest_stage_cpu_s": max(busiest), "max_bytes_sent": max(sent)}
    for name, bw in BANDWIDTHS.items():
        out[f"T_{name}"] = max(busiest) + max(sent) * 8 / bw
    return out


def scaling(a) -> dict:
    """Run the sweep (see the module docstring); prints a table and returns everything measured."""
    ranks = [int(x) for x in a.ranks.split(",")]
    pin = a.cores_per_rank
    if pin and max(ranks) * pin > len(os.sched_getaffinity(0)):
        raise SystemExit(f"--cores-per-rank {pin} at {max(ranks)} ranks needs {max(ranks) * pin} CPUs; this process "
                         f"may use {len(os.sched_getaffinity(0))}: lower --ranks or --cores-per-rank")
    work = Path(tempfile.mkdtemp(prefix="hps-scaling-", dir=a.work_dir))
    try:
        env = job_env()
        parts = [write_criteo(work / f"part-{i}.txt", a.rows, seed=i) for i in range(max(ranks) if a.weak else 1)]
        evals = write_criteo(work / "eval.txt", max(1, a.rows // 10), seed=1000)
        common = ["--format", "criteo", "--epochs", str(a.epochs), "--embedding-dim", str(a.embedding_dim),
                  "--hidden", a.hidden, "--sparse-sync", a.sparse_sync]
        out = {"rows_per_part": a.rows, "batch_size": a.batch_size, "minibatch_size": a.minibatch_size,
               "sparse_sync": a.sparse_sync, "epochs": a.epochs, "cores_per_rank": pin, "strong": {}, "weak": {}}
        tiny = work / "tiny.txt"
        with open(parts[0]) as src, open(tiny, "w") as dst:
            dst.writelines(line for _, line in zip(range(1000), src))
        one_epoch = [*common[:2], "--epochs", "1", *common[4:]]
        fixed = run_ranks(1, [*one_epoch, "--data", str(tiny), "--batch-size", str(a.batch_size),
                              "--minibatch-size", str(a.minibatch_size)], work, env, pin)
        out["fixed_cpu_s"] = fixed["time_per_rank"][0]["cpu"]
        common += ["--eval-data", str(evals)]
        for n in ranks:
            strong = [*common, "--data", str(parts[0]), "--batch-size", str(a.batch_size),
                      "--minibatch-size", str(a.minibatch_size)]
            out["strong"][n] = run_ranks(n, strong, work, env, pin)
            if a.weak:
                d = work / f"weak-{n}"
                d.mkdir()
                for p in parts[:n]:
                    (d / p.name).symlink_to(p)
                weak = [*common, "--data", str(d), "--batch-size", str(a.batch_size * n),
                        "--minibatch-size", str(a.minibatch_size * n)]
                out["weak"][n] = run_ranks(n, weak, work, env, pin)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for kind in ("strong", "weak"):
        runs = out[kind]
        if not runs:
            continue
        for m in runs.values():
            m["model"] = model(m)
        n0 = min(runs)
        base = runs[n0]
        base_cpu = sum(t["cpu"] for t in base["time_per_rank"])
        for n, m in runs.items():
            work_ratio = n / n0 if kind == "weak" else 1.0  # weak: N times the work in T(N)
            for name in BANDWIDTHS:
                m["model"][f"speedup_{name}"] = base["model"][f"T_{name}"] / m["model"][f"T_{name}"] * work_ratio
            m["job_cpu_s"] = sum(t["cpu"] for t in m["time_per_rank"])
            m["wall_s"] = max(t["wall"] for t in m["time_per_rank"])
            m["wall_speedup"] = max(t["wall"] for t in base["time_per_rank"]) / m["wall_s"] * work_ratio
            m["job_cpu_vs_1"] = m["job_cpu_s"] / base_cpu
            fixed = out["fixed_cpu_s"]
            beyond = base_cpu - n0 * fixed  # meaningless when the job is little more than its fixed cost
            m["job_cpu_beyond_fixed_vs_1"] = ((m["job_cpu_s"] - n * fixed) / beyond
                                              if beyond > 0.25 * base_cpu else None)
            # the least "job CPU x 1" can be if the work divided perfectly (weak: N times the work) and only
            # each process's fixed cost were repeated: what bounds the job-CPU target on this data
            m["job_cpu_floor_vs_1"] = (n * fixed + work_ratio * max(beyond, 0.0)) / base_cpu
            # the train stage per global mini-batch, and what it exceeds perfect division of the 1-rank job's
            times = n if kind == "weak" else 1  # weak: the batch and mini-batch were N times larger
            e = out["epochs"]
            m["minibatches"] = e * minibatches(m["examples"] // e, out["batch_size"] * times,
                                               out["minibatch_size"] * times)
            train = max(c["train"] for c in m["stage_cpu_seconds"])
            ideal = max(c["train"] for c in base["stage_cpu_seconds"]) * n0 / n * work_ratio
            m["train_ms_per_minibatch"] = 1e3 * train / max(m["minibatches"], 1)
            m["train_excess_ms_per_minibatch"] = 1e3 * (train - ideal) / max(m["minibatches"], 1)
    print(report(out))
    return out


def report(out: dict) -> str:
    lines = [f"# hps.train scaling: {out['rows_per_part']} lines per part, {out['epochs']} epoch(s), "
             f"batch {out['batch_size']}, mini-batch "
             f"{out['minibatch_size']} (weak: x N), --sparse-sync {out['sparse_sync']}; T(N) = max busiest stage "
             "CPU s + max bytes sent / link"]
    head = (f"{'':6}{'N':>3}{'ex/s':>10}{'AUC':>8}{'busiest':>9}{'MB sent':>9}{'T 100G':>8}{'x 100G':>8}"
            f"{'T 10G':>8}{'x 10G':>7}{'job CPU':>9}{'x 1':>6}{'floor':>6}{'x 1 -fix':>9}{'RSS MB (max)':>13}"
            f"{'ms/mb':>7}{'+ms/mb':>7}{'wall':>7}{'x wall':>7}")
    lines.append(head)
    for kind in ("strong", "weak"):
        for n, m in out[kind].items():
            md = m["model"]
            rss = max(t["max_rss_bytes"] for t in m["time_per_rank"]) / 1e6
            lines.append(f"{kind:6}{n:>3}{m['examples_per_sec']:>10,.0f}{m.get('auc', float('nan')):>8.4f}"
                         f"{md['busiest_stage_cpu_s']:>9.2f}{md['max_bytes_sent'] / 1e6:>9.1f}"
                         f"{md['T_100Gb/s']:>8.2f}{md['speedup_100Gb/s']:>8.2f}{md['T_10Gb/s']:>8.2f}"
                         f"{md['speedup_10Gb/s']:>7.2f}{m['job_cpu_s']:>9.1f}{m['job_cpu_vs_1']:>6.2f}"
                         f"{m['job_cpu_floor_vs_1']:>6.2f}"
                         + (f"{m['job_cpu_beyond_fixed_vs_1']:>9.2f}" if m["job_cpu_beyond_fixed_vs_1"] is not None
                            else f"{'n/a':>9}") + f"{rss:>13.0f}"
                         + f"{m['train_ms_per_minibatch']:>7.2f}{m['train_excess_ms_per_minibatch']:>7.2f}"
                         + f"{m['wall_s']:>7.1f}{m['wall_speedup']:>7.2f}")
    lines.append(f"# busiest: max over ranks of the busiest stage's CPU s outside MPI (train: with the dense pass's "
                 f"helper threads); x 100G/10G: speedup of T(N) "
                 f"(weak: N T(1)/T(N)); job CPU: user+sys s summed over ranks (bench.rank_time); floor: the least "
                 f"x 1 can be when the work divides perfectly and each process repeats only its fixed cost; x 1 -fix: "
                 f"the same "
                 f"ratio after taking away {out['fixed_cpu_s']:.2f} s per process (a 1-rank job on 1,000 lines); "
                 f"ms/mb: the busiest rank's train stage CPU ms per global mini-batch, +ms/mb: beyond the 1-rank "
                 f"job's divided by N; wall: the slowest rank's seconds, x wall: its speedup (weak: N times the "
                 f"work) -- " + (f"each rank pinned to {out['cores_per_rank']} CPUs of its own" if out["cores_per_rank"]
                                 else "ranks unpinned, sharing this machine's cores: not a scaling measure"))
    lines.append("# per rank: CPU seconds of each stage outside MPI (read / prepare / place / train, with its helper "
                 "threads); "
                 "seconds inside MPI calls, wall (the wait) and CPU, of the read / prepare / train threads; "
                 "bytes sent by kind (MB)")
    for kind in ("strong", "weak"):
        for n, m in out[kind].items():
            for r, (c, b, t, w, wc) in enumerate(zip(m["stage_cpu_seconds"], m["bytes_sent_per_rank"],
                                                     m["time_per_rank"], m["mpi_seconds"], m["mpi_cpu_seconds"])):
                kinds = " ".join(f"{k} {v / 1e6:.1f}" for k, v in b.items() if v)
                mpi = " / ".join(f"{w[s]:.2f} ({wc[s]:.2f})" for s in ("read", "prepare", "train"))
                lines.append(f"{kind:6}{n:>3} rank {r}: " + " / ".join(f"{c[s]:.2f}" for s in
                             ("read", "prepare", "place", "train"))
                             + f"; MPI {mpi}; process CPU {t['cpu']:.1f} s, RSS {t['max_rss_bytes'] / 1e6:.0f} MB; "
                             + kinds)
    return "\n".join(lines)
