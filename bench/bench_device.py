"""``--device cuda`` (GPU-resident training) beside ``--device cpu`` and a PyTorch peer on the same job:
examples/s, AUC, each stage's busy seconds, the transfer ledger's bytes (per purpose, and per mini-batch
inside the loop), and hps ``cuda`` / PyTorch (``bench/_torch_device_peer.py``: ``nn.Embedding(sparse=True)``
+ Adagrad rows, Adam dense, data made on the device before its timed loop).

    python -m bench.bench_device                      # needs a CUDA GPU; writes bench/results/device-<gpu>.json
    python -m bench.bench_device --simulate --rows 300 --fields 2 --vocab-per-field 40 --batch-size 100 \\
        --minibatch-size 50 --hidden 4 --embedding-dim 3
                                                      # proof run on Numba's CUDA simulator: bytes and AUC
                                                      # only (its examples/s mean nothing; the peer
                                                      # runs on the CPU); writes nothing

Each device runs as its own ``python -m hps.train`` process, back to back. The figures that do not
depend on the machine (AUC, bytes) are exact; examples/s needs a quiet machine with the GPU named.

One run each is a weak figure on a lent GPU: the same tree ran the job at 689–877 k examples/s within one
call on an H200 (``bench/results/gpu-h200-2026-11-28``). ``--repeat N`` runs N rounds, each the cuda job,
every ``--variant`` of it (the same job with environment variables set, e.g.
``dense-kernel:HPS_DENSE_STEP=kernel``) and the peer, in turn (A B A B): each ratio is taken within a
round, and the summary gives each one's median and its range over the rounds. ``--device cpu`` runs once.

    python -m bench.bench_device --no-cpu --repeat 3 --variant dense-kernel:HPS_DENSE_STEP=kernel
"""

from __future__ import annotations

import json
import os
import statistics
import sys

from hps._argparse import ArgumentParser

from ._torch_device_peer import train_peer
from .bench_train import RESULTS, run_job


def gpu_name() -> str | None:
    try:
        from numba import cuda

        if not cuda.is_available():
            return None
        name = cuda.get_current_device().name  # bytes in numba-cuda < 0.2x, str since
        return name.decode() if isinstance(name, bytes) else name
    except Exception:
        return None


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.bench_device", description=__doc__.split("\n\n")[0])
    p.add_argument("--simulate", action="store_true", help="run cuda on the CUDA simulator (tiny jobs only)")
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--fields", type=int, default=26)
    p.add_argument("--vocab-per-field", type=int, default=1_000_000)
    p.add_argument("--batch-size", type=int, default=65_536)
    p.add_argument("--minibatch-size", type=int, default=4096)
    p.add_argument("--hidden", default="512,256")
    p.add_argument("--embedding-dim", type=int, default=32)
    p.add_argument("--model", default="ctr")
    p.add_argument("--sparse-optimizer", default="adagrad")
    p.add_argument("--n-parts", type=int, default=1, help="HBM-PS parts, over every visible GPU (1)")
    p.add_argument("--hbm-budget", default=None, help="--hbm-budget of the hps jobs (their default)")
    p.add_argument("--gil-switch-interval", default=None, help="--gil-switch-interval of the hps jobs (their default)")
    p.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer")
    p.add_argument("--no-cpu", action="store_true", help="skip the --device cpu job (its host side alone is "
                   "bench_host's)")
    p.add_argument("--repeat", type=int, default=1, help="rounds of the cuda job, its variants and the peer, in "
                   "turn; figures are medians over the rounds, with their range (1)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                   help="also run the cuda job with these environment variables in every round (repeatable)")
    a = p.parse_args(argv)
    job = ["--rows", str(a.rows), "--fields", str(a.fields), "--vocab-per-field", str(a.vocab_per_field),
           "--batch-size", str(a.batch_size), "--minibatch-size", str(a.minibatch_size), "--hidden", a.hidden,
           "--embedding-dim", str(a.embedding_dim), "--model", a.model, "--sparse-optimizer", a.sparse_optimizer,
           "--n-parts", str(a.n_parts)] + (["--hbm-budget", a.hbm_budget] if a.hbm_budget else []) \
        + (["--gil-switch-interval", a.gil_switch_interval] if a.gil_switch_interval else [])
    gpu = "CUDA simulator" if a.simulate else gpu_name()
    if gpu is None:
        raise SystemExit("no CUDA GPU: run on a machine with one, or --simulate for a tiny proof run")
    sim = {"NUMBA_ENABLE_CUDASIM": "1"} if a.simulate else {}  # the jobs' environment, not this process's
    out = {"gpu": gpu, "job": job, "cuda_launch": os.environ.get("HPS_CUDA_LAUNCH", "driver-gil"),  # hps._driver_launch
           "dense_step": os.environ.get("HPS_DENSE_STEP", "ops")}  # hps.model._dense_optim
    variants = dict(_variant(v) for v in a.variant)
    if a.repeat < 1 or "cuda" in variants:
        raise SystemExit("--repeat must be >= 1 and no variant may be named cuda")
    if not a.no_peer and (a.model, a.sparse_optimizer) != ("ctr", "adagrad"):
        print("torch peer skipped: it trains --model ctr with --sparse-optimizer adagrad only")
        a.no_peer = True
    if not a.no_cpu:
        out["cpu"] = _hps_job(job, "cpu", sim)
    runs: dict = {name: [] for name in ("cuda", *variants, *(() if a.no_peer else ("torch",)))}
    for _ in range(a.repeat):
        for name, env in (("cuda", {}), *variants.items()):
            runs[name].append(_hps_job(job, "cuda", {**sim, **env}, name))
        if not a.no_peer:
            peer = train_peer(a.rows, a.fields, a.vocab_per_field, a.embedding_dim, a.minibatch_size,
                              tuple(int(h) for h in a.hidden.split(",")), device="cpu" if a.simulate else "cuda")
            print(f"torch {peer['examples_per_sec']:>12,.0f} examples/s on {peer['device']} ({peer['torch']})")
            runs["torch"].append(peer)
    eps = {name: [r["examples_per_sec"] for r in rs] for name, rs in runs.items()}
    out["cuda"] = _median_run(runs["cuda"])
    out["rounds"] = a.repeat
    out["examples_per_sec"] = {name: _spread(v) for name, v in eps.items()}
    if variants:
        out["variants"] = {name: {"env": env, "over_cuda": _spread(_ratios(eps[name], eps["cuda"])),
                                  "run": _median_run(runs[name])} for name, env in variants.items()}
    if not a.no_peer:
        out["torch"] = _median_run(runs["torch"])
        ratios = _ratios(eps["cuda"], eps["torch"])
        out["hps_cuda_over_torch"] = statistics.median(ratios)
        out["hps_cuda_over_torch_spread"] = _spread(ratios)
    print(f"over {a.repeat} round(s), examples/s median (range): " + "; ".join(
        f"{name} {s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})" for name, s in out["examples_per_sec"].items()))
    for name, v in out.get("variants", {}).items():
        r = v["over_cuda"]
        print(f"{name} / cuda in the same round: median {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})")
    if not a.no_peer:
        r = out["hps_cuda_over_torch_spread"]
        print(f"hps cuda / torch in the same round: median {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})"
              + (" (simulator: meaningless)" if a.simulate else ""))
    if not a.simulate:
        RESULTS.mkdir(exist_ok=True)
        parts = f"-{a.n_parts}parts" if a.n_parts > 1 else ""
        path = RESULTS / f"device-{gpu.replace(' ', '_')}{parts}.json"
        path.write_text(json.dumps(out, indent=1))
        print(f"wrote {path}")
    return 0


def _variant(spec: str) -> tuple[str, dict]:
    """``NAME:VAR=VALUE[,VAR=VALUE]`` -> (name, {var: value})."""
    name, _, assigns = spec.partition(":")
    env = dict(kv.split("=", 1) for kv in assigns.split(",") if "=" in kv)
    if not name or not env or len(env) != len(assigns.split(",")):
        raise SystemExit(f"--variant {spec!r}: want NAME:VAR=VALUE[,VAR=VALUE], "
                         "e.g. dense-kernel:HPS_DENSE_STEP=kernel")
    return name, env


def _hps_job(job: list, device: str, env: dict | None = None, name: str | None = None) -> dict:
    """One ``python -m hps.train`` job on ``device`` (``env`` added to its environment), printed; its figures."""
    m = run_job([*job, "--device", device], env=env)
    per_mb = m["d2h_bytes"]["minibatch"] + m["h2d_bytes"]["minibatch"]
    # what the host uploads besides rows, per raw batch byte (keys deduplicated on the device: ~1.0)
    m["h2d_per_raw_byte"] = ((sum(m["h2d_bytes"].values()) - m["h2d_bytes"]["fetch"]) / m["batch_bytes"]
                             if m["batch_bytes"] else 0.0)
    busy = ", ".join(f"{k} {v:.2f}" for k, v in m["stage_seconds"].items())
    print(f"{name or device:5s} {m['examples_per_sec']:>12,.0f} examples/s  AUC {m['auc']:.4f}  "
          f"h2d {m['h2d_bytes']}  d2h {m['d2h_bytes']}  "
          f"in-loop bytes per mini-batch {per_mb / max(1, m['minibatches']):.1f}; h2d but rows per raw "
          f"batch byte {m['h2d_per_raw_byte']:.3f} ({m['device_dedup_batches']} batches deduplicated on "
          f"the device)\n"
          f"      stage busy seconds: {busy}; bottleneck {m['bottleneck']}; HBM-PS rows fetched "
          f"{m['hbm_fetched_rows']:,} ({m['hbm_born_rows']:,} born on the device), evicted "
          f"{m['hbm_evicted_rows']:,}, table {m['table_rows']:,}; GPU paths {m.get('gpu_paths')}", flush=True)
    return {**{k: m[k] for k in ("examples_per_sec", "auc", "examples", "h2d_bytes", "d2h_bytes", "peer_bytes",
                                 "minibatches", "command", "stage_seconds", "bottleneck", "hbm_fetched_rows",
                                 "hbm_born_rows", "hbm_evicted_rows", "table_rows", "batch_bytes",
                                 "device_dedup_batches", "h2d_per_raw_byte")}, "gpu_paths": m.get("gpu_paths")}


def _ratios(a: list, b: list) -> list:
    """``a[i] / b[i]``: each round's ratio (0 where ``b[i]`` is)."""
    return [x / y if y else 0.0 for x, y in zip(a, b)]


def _spread(values: list) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": list(values)}


def _median_run(runs: list) -> dict:
    """The run of the median examples/s (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r["examples_per_sec"])[(len(runs) - 1) // 2]


if __name__ == "__main__":
    sys.exit(main())
