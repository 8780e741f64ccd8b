"""``python -m bench.bench_het``: HET caches (``--consistency het``) against BSP at 4 ranks.

Two jobs, both ``--model wdl``: a synthetic Zipf job (its own eval split) and a Criteo-format file
(``../shared/data/criteo_sample/train-10k.txt``: the first 8,000 lines train, the last 2,000
evaluate; skipped when the data is absent). For each: BSP, HET at ``s = 0`` (which must train exactly
like BSP), and HET at ``s`` in {10, 100, 1000, inf} with per-rank caches of 5 %, 10 % and 15 % of the
embedding table (the synthetic vocabulary; for the file, the table's keys as the BSP run counted them,
passed as bytes through ``hps.train._het.entry_bytes``).

Reported per run, all from the trainer's ``--metrics-out`` and deterministic (the same on any machine):

- embedding bytes sent per example, all ranks: every ``bytes_sent`` kind but the dense all-reduce
  (keys of the plan, rows, gradients; HET: clocks, fetch flags, pushes), and the reduction against BSP;
- the HET cache hit rate (reads of other ranks' keys served from the cache), fetches, pushes,
  invalidations, evictions;
- eval AUC and logloss, and the AUC difference against ``s = 0``;
- the modeled communication time per example at 1 Gb/s and 10 Gb/s links (HET's two clusters): the
  most bytes any rank sends (embedding and dense) / link bandwidth / examples. Compute time is not
  modeled: on this shared machine it is noise (``bench.bench_train scaling`` models it).

Targets (seeds/001; docs/het.md): at ``s = 100`` with a 10 % cache, >= 88 % less embedding traffic than BSP and AUC
within 0.001 of ``s = 0``. Raw results go to ``bench/results/het.json`` (``--out``).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from bench._jobs import train_job
from hps._argparse import ArgumentParser

CRITEO = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo_sample" / "train-10k.txt"
STALENESS = ("10", "100", "1000", "inf")
CACHES = (0.05, 0.10, 0.15)
BANDWIDTHS = {"1Gb/s": 1e9, "10Gb/s": 10e9}
COMMON = ["--model", "wdl", "--embedding-dim", "16", "--hidden", "128,64", "--no-progress"]


def run(n: int, args: list[str], work: Path, name: str) -> dict:
    """``mpiexec -n n python -m hps.train args`` -> its metrics."""
    return train_job(args, work / f"{name}.json", ranks=n, single_threaded=True)


def summarize(m: dict) -> dict:
    ex = max(m["examples"], 1)
    emb = {k: v / ex for k, v in m["bytes_sent"].items() if k != "dense_allreduce" and v}
    worst = max(sum(r.values()) for r in m["bytes_sent_per_rank"])
    row = {"examples": m["examples"], "auc": m.get("auc"), "logloss": m.get("logloss"),
           "embedding_bytes_per_example": sum(emb.values()), "embedding_bytes_by_kind": emb,
           "dense_bytes_per_example": m["bytes_sent"]["dense_allreduce"] / ex,
           "comm_us_per_example": {b: 1e6 * worst * 8 / w / ex for b, w in BANDWIDTHS.items()},
           "table_rows": m["table_rows"]}
    if m.get("consistency") == "het":
        row.update({k: m[k] for k in ("staleness", "het_hit_rate", "het_fetches", "het_pushes",
                                      "het_invalidations", "het_evictions", "het_cache_entries")})
    return row


def sweep(name: str, n: int, args: list[str], work: Path, table_keys, entry, log, staleness=STALENESS,
          caches=CACHES) -> dict:
    """BSP, HET s = 0, and HET over STALENESS x CACHES for one job -> {run name: summary}."""
    runs = {"bsp": summarize(run(n, args, work, f"{name}-bsp"))}
    keys = table_keys if table_keys is not None else runs["bsp"]["table_rows"]

    def cache_arg(f):  # a fraction of the synthetic vocabulary, else bytes of f x the table's keys
        return str(f) if table_keys is not None else str(int(f * keys * entry))

    het = ["--consistency", "het"]
    runs["s=0"] = summarize(run(n, [*args, *het, "--staleness", "0", "--het-cache", cache_arg(0.10)], work,
                                f"{name}-s0"))
    log(line(name, "bsp", runs["bsp"], runs["bsp"], runs["bsp"]))
    log(line(name, "s=0", runs["s=0"], runs["bsp"], runs["s=0"]))
    for s in staleness:
        for f in caches:
            key = f"s={s},cache={f:.0%}"
            runs[key] = summarize(run(n, [*args, *het, "--staleness", s, "--het-cache", cache_arg(f)], work,
                                      f"{name}-s{s}-c{f}"))
            log(line(name, key, runs[key], runs["bsp"], runs["s=0"]))
    return runs


def line(job, key, r, bsp, s0) -> str:
    red = 1 - r["embedding_bytes_per_example"] / bsp["embedding_bytes_per_example"]
    hit = f"{r['het_hit_rate']:.3f}" if "het_hit_rate" in r else "-"
    comm = " ".join(f"{v:.2f}" for v in r["comm_us_per_example"].values())
    return (f"{job:9s} {key:20s} emb B/ex {r['embedding_bytes_per_example']:8.1f} ({red:+.1%} vs BSP)  hit {hit}  "
            f"AUC {r['auc']:.4f} (vs s=0 {r['auc'] - s0['auc']:+.4f})  logloss {r['logloss']:.4f}  "
            f"comm us/ex @1,10Gb/s {comm}")


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.bench_het", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rows", type=int, default=100_000, help="synthetic examples")
    p.add_argument("--fields", type=int, default=8)
    p.add_argument("--vocab-per-field", type=int, default=20_000)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--minibatch-size", type=int, default=1024, help="synthetic global mini-batch")
    p.add_argument("--staleness", default=",".join(STALENESS), help="s values besides 0, comma separated")
    p.add_argument("--caches", default=",".join(map(str, CACHES)), help="cache fractions, comma separated")
    p.add_argument("--no-criteo", dest="criteo", action="store_false", help="the synthetic job only")
    p.add_argument("--sparse-optimizer", default="rowwise-adagrad",
                   help="row optimizer; a fetched row carries its optimizer state (rowwise-adagrad: 1 column)")
    p.add_argument("--out", default="bench/results/het.json")
    a = p.parse_args(argv)
    from hps.model import make_sparse_optimizer
    from hps.train._het import entry_bytes

    P = 16 + 1  # wdl: embedding + first-order weight
    W = make_sparse_optimizer(a.sparse_optimizer, 0.1).row_width(P)
    common = [*COMMON, "--sparse-optimizer", a.sparse_optimizer]
    results = {"ranks": a.ranks, "model": "wdl", "sparse_optimizer": a.sparse_optimizer, "jobs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-het-") as tmp:
        work = Path(tmp)
        grid = {"staleness": a.staleness.split(","), "caches": [float(f) for f in a.caches.split(",")]}
        syn = [*common, "--rows", str(a.rows), "--fields", str(a.fields), "--vocab-per-field",
               str(a.vocab_per_field), "--zipf", str(a.zipf), "--batch-size", "16384", "--minibatch-size",
               str(a.minibatch_size)]
        results["jobs"]["synthetic"] = {"args": syn, "runs": sweep("synthetic", a.ranks, syn, work,
                                                                   a.fields * a.vocab_per_field, entry_bytes(W, P),
                                                                   print, **grid)}
        if a.criteo and CRITEO.exists():
            lines = CRITEO.read_text().splitlines(keepends=True)
            (work / "train.txt").write_text("".join(lines[:8000]))
            (work / "eval.txt").write_text("".join(lines[8000:]))
            cri = [*common, "--format", "criteo", "--data", str(work / "train.txt"), "--eval-data",
                   str(work / "eval.txt"), "--batch-size", "2048", "--minibatch-size", "256"]
            runs = sweep("criteo", a.ranks, cri, work, None, entry_bytes(W, P), print, **grid)
            results["jobs"]["criteo-10k"] = {"args": [x if "/" not in x else Path(x).name for x in cri], "runs": runs}
        elif a.criteo:
            print(f"criteo: {CRITEO} absent, skipped")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1))
    print(f"raw results: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
