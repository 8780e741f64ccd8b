"""``python -m bench.bench_oposrp``: what OP+OSRP hashing (seed 004 §2, ``--op-osrp BINS``) costs in AUC
as it shrinks the model — the full model against BINS in {2^10, 2^14, 2^18} (2 x BINS binary features
at most) on three data sets, the same network and flags otherwise, one process:

- ``frappe``: ``../shared/data/frappe`` (train on frappe.validation.libfm, evaluate on frappe.test.libfm,
  3 epochs); skipped when the data is absent;
- ``criteo``: a Criteo-format file generated here (``bench.train_scaling.write_criteo``, ``--rows``
  lines, and a tenth of that for evaluation);
- ``synthetic``: the built-in generator (``--rows`` examples, its own eval split).

Per run: eval AUC and logloss, keys in the table (sparse rows), embedding and dense parameters. The
paper's observation (Tables 1-2): AUC falls as k shrinks. All figures are deterministic. Raw metrics
and the summary go to ``bench/results/oposrp.json`` (``--out``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from bench._jobs import write_result
from hps._argparse import ArgumentParser
from hps.train import main as train

RESULTS = Path(__file__).resolve().parent / "results"
FRAPPE = Path(__file__).resolve().parents[2] / "shared" / "data" / "frappe"
BINS = (2 ** 10, 2 ** 14, 2 ** 18)
COMMON = ["--no-progress", "--embedding-dim", "16", "--batch-size", "8192", "--minibatch-size", "512"]


def datasets(rows: int, tmp: Path) -> dict:
    from bench.train_scaling import write_criteo

    out = {}
    if FRAPPE.is_dir():
        out["frappe"] = ["--format", "libsvm", "--data", str(FRAPPE / "frappe.validation.libfm"),
                         "--eval-data", str(FRAPPE / "frappe.test.libfm"), "--epochs", "3"]
    tr, ev = write_criteo(tmp / "criteo.txt", rows, seed=1), write_criteo(tmp / "criteo-eval.txt", rows // 10, seed=2)
    out["criteo"] = ["--format", "criteo", "--data", str(tr), "--eval-data", str(ev)]
    out["synthetic"] = ["--rows", str(rows)]
    return out


def run(args: list[str], tmp: Path) -> dict:
    m = tmp / "m.json"
    code = train([*COMMON, *args, "--metrics-out", str(m)])
    if code != 0:
        raise SystemExit(f"hps.train {' '.join(args)} exited {code}")
    return json.loads(m.read_text())


def summarise(m: dict) -> dict:
    return {"auc": m["auc"], "logloss": m["logloss"], "keys": m["table_rows"],
            "embedding_parameters": m["sparse_parameters"], "dense_parameters": m["dense_parameters"]}


def report(s: dict) -> str:
    lines = [f"{'data':<10} {'hashing':<12} {'AUC':>7} {'dAUC':>8} {'logloss':>8} {'keys':>10} {'emb params':>12}"]
    for data, by in s.items():
        full = by["full"]["auc"]
        for name, r in by.items():
            lines.append(f"{data:<10} {name:<12} {r['auc']:>7.4f} {r['auc'] - full:>+8.4f} {r['logloss']:>8.4f} "
                         f"{r['keys']:>10,} {r['embedding_parameters']:>12,}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.bench_oposrp", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000, help="criteo and synthetic training examples (200000)")
    p.add_argument("--data", default="frappe,criteo,synthetic")
    p.add_argument("--out", default=str(RESULTS / "oposrp.json"))
    a = p.parse_args(argv)
    raw, summary = {}, {}
    with tempfile.TemporaryDirectory(prefix="hps-bench-oposrp-") as tmp:
        sets = datasets(a.rows, Path(tmp))
        for data in a.data.split(","):
            if data not in sets:
                print(f"{data}: skipped (no data)", flush=True)
                continue
            for name, extra in [("full", [])] + [(f"2^{b.bit_length() - 1} bins", ["--op-osrp", str(b)]) for b in BINS]:
                m = run([*sets[data], *extra], Path(tmp))
                raw.setdefault(data, {})[name] = m
                summary.setdefault(data, {})[name] = summarise(m)
                print(f"{data} {name}: AUC {m['auc']:.4f}, {m['table_rows']:,} keys", flush=True)
    text = report(summary)
    print(text)
    write_result(a.out, "bench_oposrp", argv, {"rows": a.rows, "summary": summary, "metrics": raw})
    return 0


if __name__ == "__main__":
    sys.exit(main())
