"""``python -m bench.bench_fae``: FAE (``--fae``, docs/fae.md) against the baseline hps run.

For each data set — synthetic Zipf data (``--alphas``, default 0.9 and 1.1) and a Criteo-format file
(``--criteo``, default the shared 10k-row Criteo sample: ordered split, first 90 % train, last 10 %
eval) — and each rank count (``--ranks``, default 1 and 4, ``mpiexec -n N``):

- the **baseline** ``python -m hps.train`` run;
- for each hot budget (``--budgets``, percent of the table's bytes, default 1, 5, 10): the profiler
  (``hps.profile.profile`` with ``exact``: profiler seconds, estimated hot size and its interval
  against the actual one), then ``python -m hps.train --fae PROFILE`` on the same data.

Every run reports examples/s, bytes sent per example (all kinds, all ranks), eval AUC / logloss and
(FAE) the fraction of hot inputs trained, hot and cold mini-batches and Shuffle Scheduler swaps. The
model is ``--model`` (default dlrm). Raw records go to ``--out`` (bench/results/fae.json), a table to
stdout. Timing is only meaningful on a quiet machine with one core per rank.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from bench._jobs import train_job, write_result
from hps._argparse import ArgumentParser

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CRITEO = ROOT.parent / "shared" / "data" / "criteo_sample" / "train-10k.txt"


def train(n_ranks: int, args: list[str], work: Path, name: str) -> dict:
    """Metrics of ``python -m hps.train args`` on ``n_ranks`` ranks."""
    return train_job(args, work / f"{name}.json", ranks=n_ranks)


def summary(m: dict) -> dict:
    sent = sum(m["bytes_sent"].values())
    out = {"examples": m["examples"], "examples_per_sec": m["examples_per_sec"], "train_seconds": m["train_seconds"],
           "bytes_sent_per_example": sent / max(m["examples"], 1), "bytes_sent": m["bytes_sent"],
           "auc": m.get("auc"), "logloss": m.get("logloss"), "table_rows": m["table_rows"]}
    if "fae" in m:
        f = m["fae"]
        out.update({k: f[k] for k in ("hot_rows", "hot_input_fraction", "hot_minibatches", "cold_minibatches",
                                      "swaps", "final_rate")})
    return out


def datasets(a, work: Path) -> list[tuple[str, list[str], dict]]:
    """(name, hps.train data flags, hps.profile data arguments) of every data set."""
    from hps.train._feed import format_options
    from hps.config import DataConfig

    out = []
    for alpha in a.alphas:
        flags = ["--format", "synthetic", "--rows", str(a.rows), "--fields", str(a.fields),
                 "--vocab-per-field", str(a.vocab), "--zipf", str(alpha)]
        d = DataConfig(format="synthetic", rows=a.rows, fields=a.fields, vocab_per_field=a.vocab, zipf=alpha)
        out.append((f"zipf-{alpha}", flags, {"data": None, "fmt": "synthetic",
                                             "fmt_options": format_options(d, 0, a.batch_size)}))
    if a.criteo and Path(a.criteo).exists():
        lines = Path(a.criteo).read_text().splitlines(keepends=True)
        cut = len(lines) * 9 // 10
        tr, ev = work / "criteo-train.txt", work / "criteo-eval.txt"
        tr.write_text("".join(lines[:cut]))
        ev.write_text("".join(lines[cut:]))
        out.append(("criteo", ["--format", "criteo", "--data", str(tr), "--eval-data", str(ev)],
                    {"data": str(tr), "fmt": "criteo", "fmt_options": {}}))
    elif a.criteo:
        print(f"bench_fae: {a.criteo} not found: Criteo case skipped", file=sys.stderr)
    return out


def row_bytes(model_flags: dict) -> int:
    from hps.model import MODELS, make_sparse_optimizer
    from hps.profile import row_bytes_of

    width = make_sparse_optimizer("adagrad", 0.1).row_width(model_flags["embedding_dim"]
                                                            + MODELS[model_flags["model"]].first_order)
    return row_bytes_of(width)


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.bench_fae", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=200_000, help="synthetic training rows (200000)")
    p.add_argument("--fields", type=int, default=4, help="synthetic categorical fields (4)")
    p.add_argument("--vocab", type=int, default=20_000, help="synthetic values per field (20000)")
    p.add_argument("--alphas", type=lambda s: [float(x) for x in s.split(",")], default=[0.9, 1.1])
    p.add_argument("--criteo", default=str(DEFAULT_CRITEO), help="Criteo-format file ('' to skip)")
    p.add_argument("--ranks", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    p.add_argument("--budgets", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 5.0, 10.0],
                   help="hot budgets, percent of the table's bytes")
    p.add_argument("--model", default="dlrm")
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--minibatch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--sample-rate", type=float, default=5.0, help="profiler input sample, percent (5)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "fae.json"))
    a = p.parse_args(argv)
    from hps.profile import profile, write_profile

    rb = row_bytes({"model": a.model, "embedding_dim": a.embedding_dim})
    common = ["--model", a.model, "--embedding-dim", str(a.embedding_dim), "--batch-size", str(a.batch_size),
              "--minibatch-size", str(a.minibatch_size), "--epochs", str(a.epochs)]
    records = []
    with tempfile.TemporaryDirectory(prefix="bench-fae-") as tmp:
        work = Path(tmp)
        for name, flags, pargs in datasets(a, work):
            table = profile(pargs["data"], pargs["fmt"], 0, rb, sample_rate=100, fmt_options=pargs["fmt_options"])
            table_rows = table.logged_entries
            for n in a.ranks:
                base = summary(train(n, [*flags, *common], work, f"{name}-{n}-base"))
                records.append({"data": name, "ranks": n, "budget_percent": 0.0, "mode": "baseline", **base})
                print(f"{name} ranks {n} baseline: {base['examples_per_sec']:,.0f} ex/s, "
                      f"{base['bytes_sent_per_example']:.0f} B/ex, AUC {base['auc']:.4f}", flush=True)
                for pct in a.budgets:
                    hot_bytes = int(table_rows * rb * pct / 100)
                    t0 = time.perf_counter()
                    prof = profile(pargs["data"], pargs["fmt"], hot_bytes, rb, sample_rate=a.sample_rate, exact=True,
                                   fmt_options=pargs["fmt_options"])
                    prof_s = time.perf_counter() - t0
                    path = work / f"{name}-{pct}.h5"
                    write_profile(path, prof)
                    fae = summary(train(n, [*flags, *common, "--fae", str(path)], work, f"{name}-{n}-{pct}"))
                    rec = {"data": name, "ranks": n, "budget_percent": pct, "mode": "fae", "table_keys": table_rows,
                           "row_bytes": rb, "hot_bytes": hot_bytes, "profiler_seconds": prof.seconds,
                           "profiler_seconds_with_exact": prof_s, "estimate": prof.estimate,
                           "interval": [prof.interval_low, prof.interval_high], "actual": prof.actual,
                           "actual_inside": prof.inside, "logged_hot": prof.logged_hot,
                           "profiled_hot_input_fraction": prof.hot_input_fraction, **fae,
                           "speedup": fae["examples_per_sec"] / base["examples_per_sec"],
                           "auc_delta": (fae["auc"] - base["auc"]) if fae["auc"] is not None else None}
                    records.append(rec)
                    print(f"{name} ranks {n} hot {pct:g} %: {rec['hot_rows']:,} hot rows, hot inputs "
                          f"{100 * rec['hot_input_fraction']:.1f} %, estimate {prof.estimate:,.0f} "
                          f"[{prof.interval_low:,.0f}, {prof.interval_high:,.0f}] actual {prof.actual:,} "
                          f"(sample {a.sample_rate:g} %), profiler {prof.seconds:.2f} s, "
                          f"{rec['examples_per_sec']:,.0f} ex/s ({rec['speedup']:.2f}x), "
                          f"{rec['bytes_sent_per_example']:.0f} B/ex, AUC {rec['auc']:.4f} "
                          f"({rec['auc_delta']:+.4f}), logloss {rec['logloss']:.4f}", flush=True)
    write_result(a.out, "bench_fae", argv, {"records": records})
    print(f"bench_fae: {len(records)} records in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
