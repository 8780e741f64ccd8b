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
"""

from __future__ import annotations

import json
import os
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
    a = p.parse_args(argv)
    job = ["--rows", str(a.rows), "--fields", str(a.fields), "--vocab-per-field", str(a.vocab_per_field),
           "--batch-size", str(a.batch_size), "--minibatch-size", str(a.minibatch_size), "--hidden", a.hidden,
           "--embedding-dim", str(a.embedding_dim), "--model", a.model, "--sparse-optimizer", a.sparse_optimizer,
           "--n-parts", str(a.n_parts)] + (["--hbm-budget", a.hbm_budget] if a.hbm_budget else []) \
        + (["--gil-switch-interval", a.gil_switch_interval] if a.gil_switch_interval else [])
    gpu = "CUDA simulator" if a.simulate else gpu_name()
    if gpu is None:
        raise SystemExit("no CUDA GPU: run on a machine with one, or --simulate for a tiny proof run")
    if a.simulate:
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"  # inherited by the child processes
    out = {"gpu": gpu, "job": job, "cuda_launch": os.environ.get("HPS_CUDA_LAUNCH", "driver-gil"),  # hps._driver_launch
           "dense_step": os.environ.get("HPS_DENSE_STEP", "ops")}  # hps.model._dense_optim
    for device in ("cuda",) if a.no_cpu else ("cpu", "cuda"):
        m = run_job([*job, "--device", device])
        per_mb = m["d2h_bytes"]["minibatch"] + m["h2d_bytes"]["minibatch"]
        # what the host uploads besides rows, per raw batch byte (keys deduplicated on the device: ~1.0)
        m["h2d_per_raw_byte"] = ((sum(m["h2d_bytes"].values()) - m["h2d_bytes"]["fetch"]) / m["batch_bytes"]
                                 if m["batch_bytes"] else 0.0)
        out[device] = {k: m[k] for k in ("examples_per_sec", "auc", "examples", "h2d_bytes", "d2h_bytes",
                                         "peer_bytes", "minibatches", "command", "stage_seconds", "bottleneck",
                                         "hbm_fetched_rows", "hbm_born_rows", "hbm_evicted_rows", "table_rows",
                                         "batch_bytes", "device_dedup_batches", "h2d_per_raw_byte")}
        busy = ", ".join(f"{k} {v:.2f}" for k, v in m["stage_seconds"].items())
        print(f"{device:5s} {m['examples_per_sec']:>12,.0f} examples/s  AUC {m['auc']:.4f}  "
              f"h2d {m['h2d_bytes']}  d2h {m['d2h_bytes']}  "
              f"in-loop bytes per mini-batch {per_mb / max(1, m['minibatches']):.1f}; h2d but rows per raw "
              f"batch byte {m['h2d_per_raw_byte']:.3f} ({m['device_dedup_batches']} batches deduplicated on "
              f"the device)\n"
              f"      stage busy seconds: {busy}; bottleneck {m['bottleneck']}; HBM-PS rows fetched "
              f"{m['hbm_fetched_rows']:,} ({m['hbm_born_rows']:,} born on the device), evicted "
              f"{m['hbm_evicted_rows']:,}, table {m['table_rows']:,}")
    if not a.no_peer and (a.model, a.sparse_optimizer) != ("ctr", "adagrad"):
        print("torch peer skipped: it trains --model ctr with --sparse-optimizer adagrad only")
    elif not a.no_peer:
        peer = train_peer(a.rows, a.fields, a.vocab_per_field, a.embedding_dim, a.minibatch_size,
                          tuple(int(h) for h in a.hidden.split(",")), device="cpu" if a.simulate else "cuda")
        out["torch"] = peer
        ratio = out["cuda"]["examples_per_sec"] / peer["examples_per_sec"] if peer["examples_per_sec"] else 0.0
        out["hps_cuda_over_torch"] = ratio
        print(f"torch {peer['examples_per_sec']:>12,.0f} examples/s on {peer['device']} ({peer['torch']}); "
              f"hps cuda / torch = {ratio:.3f}" + (" (simulator: meaningless)" if a.simulate else ""))
    if not a.simulate:
        RESULTS.mkdir(exist_ok=True)
        parts = f"-{a.n_parts}parts" if a.n_parts > 1 else ""
        path = RESULTS / f"device-{gpu.replace(' ', '_')}{parts}.json"
        path.write_text(json.dumps(out, indent=1))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
