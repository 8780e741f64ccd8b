"""Feature admission and expiry on a long synthetic stream with drifting popularity (docs/admission.md).

    python -m bench.bench_admission                     # writes bench/results/admission.json
    python -m bench.bench_admission --rows 800000       # a longer stream

The stream: ``--drift`` makes the popular values of every field move by ``drift`` ranks per example
(``hps/data/_synthetic.py``), so new keys keep arriving and old ones fall out of use, and the eval
split is drawn at the end of the stream (today's popularity). Each configuration trains the same
stream, cut at 1/4, 1/2 and all of its length, and reports the table size (keys with a row, SSD-PS
bytes on disk), eval AUC and logloss, and the admitted / expired key counts: without admission and
expiry the table grows with the stream; with expiry it stops growing; with admission it holds only
keys seen K times. Every figure is a count or an AUC: deterministic (same command, same numbers),
not a timing. Each run is ``hps.train.main`` in this process, one after the other.
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
import tempfile
from pathlib import Path

from hps._argparse import ArgumentParser
from hps.train import main

RESULTS = Path(__file__).resolve().parent / "results"

CONFIGS = {
    "baseline": [],
    "admit-after 3": ["--admit-after", "3"],
    "expire-after 8": ["--expire-after", "8"],
    "admit-after 3 + expire-after 8": ["--admit-after", "3", "--expire-after", "8"],
}
KEYS = ("table_rows", "ssd_disk_bytes", "auc", "logloss", "admitted_keys", "expired_keys", "examples")


def stream_args(a, rows: int) -> list[str]:
    return ["--rows", str(rows), "--fields", str(a.fields), "--vocab-per-field", str(a.vocab),
            "--zipf", str(a.zipf), "--drift", str(a.drift), "--batch-size", str(a.batch_size),
            "--minibatch-size", str(a.minibatch_size), "--embedding-dim", "8", "--hidden", "32,16",
            "--no-progress", "--seed", "0"]


def run_one(args: list[str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="hps-bench-admission-") as tmp:
        out = Path(tmp) / "m.json"
        if main([*args, "--metrics-out", str(out)]) != 0:
            raise SystemExit(f"job failed: python -m hps.train {' '.join(args)}")
        m = json.loads(out.read_text())
    return {k: m.get(k) for k in KEYS}


def main_bench(argv=None) -> dict:
    p = ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--zipf", type=float, default=1.05)
    p.add_argument("--drift", type=float, default=0.25)
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--minibatch-size", type=int, default=1024)
    p.add_argument("--out", default=str(RESULTS / "admission.json"))
    a = p.parse_args(argv)
    lengths = [a.rows // 4, a.rows // 2, a.rows]
    results = {}
    for name, flags in CONFIGS.items():
        results[name] = {}
        for rows in lengths:
            r = run_one([*stream_args(a, rows), *flags])
            results[name][str(rows)] = r
            print(f"{name:32s} rows {rows:>9,}: table {r['table_rows']:>9,} keys, "
                  f"disk {r['ssd_disk_bytes'] / 2**20:7.1f} MiB, AUC {r['auc']:.4f}, logloss {r['logloss']:.4f}, admitted {r['admitted_keys']}, "
                  f"expired {r['expired_keys']}", flush=True)
    payload = {"results": results, "lengths": lengths, "date": datetime.date.today().isoformat(),
               "machine": platform.machine(),
               "command": " ".join(["python -m bench.bench_admission",
                                    *(argv if argv is not None else sys.argv[1:])]),
               "stream": " ".join(stream_args(a, a.rows))}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(payload, indent=1))
    print(f"wrote {a.out}")
    return payload


if __name__ == "__main__":
    main_bench()
