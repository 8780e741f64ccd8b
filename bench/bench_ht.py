"""``python -m bench.bench_ht``: Hierarchical Training (seeds/002 §3; docs/hierarchical.md) at 4 ranks on
the same data in one invocation — dense sync ``allreduce`` (one dense copy), ``easgd`` with 2 groups of 2 and with 4
groups of 1 — each with ``--compress none``, ``bf16`` and ``int8``.

Per job: eval AUC and logloss, dense bytes (``dense_allreduce`` + ``dense_easgd``) and sparse bytes
(``sparse_keys``, ``sparse_rows``, ``sparse_grads``) sent per example over all ranks, and a modeled
time per example on a link of 10 Gb/s:

    T = (max over ranks of the busiest stage's CPU seconds + max over ranks of bytes sent / W) / examples

(``bench/train_scaling.py``'s model: the 4-stage pipeline overlaps its stages, ranks have their own
cores). Bytes and AUC are deterministic; the CPU term is measured on whatever machine runs this (on a
shared one it is noise), so the report also gives the link term alone. Targets: bf16 halves the
bytes of every compressed kind with AUC within 0.0005 of none; int8 rows cut the served-row bytes
>= 3.5x with AUC within 0.002; 2 EASGD groups within 0.002 AUC of allreduce.

Raw metrics and the summary go to ``bench/results/ht.json`` (``--out``).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from bench._jobs import train_job, write_result
from hps._argparse import ArgumentParser
from hps.config import COMPRESS_MODES as COMPRESS

RESULTS = Path(__file__).resolve().parent / "results"
W_BITS = 10e9
DENSE_KINDS = ("dense_allreduce", "dense_easgd")
SPARSE_KINDS = ("sparse_keys", "sparse_rows", "sparse_grads", "sparse_pull", "sparse_allreduce")
SYNCS = {"allreduce": [], "easgd-2x2": ["--dense-sync", "easgd", "--groups", "2"],
         "easgd-4x1": ["--dense-sync", "easgd", "--groups", "4"]}


def run_job(n: int, args: list[str], work: Path) -> dict:
    return train_job(args, work / "m.json", ranks=n, single_threaded=True)


def summarise(m: dict) -> dict:
    ex = max(m["examples"], 1)
    per = {k: v / ex for k, v in m["bytes_sent"].items()}
    busiest = max(max(c.values()) for c in m["stage_cpu_seconds"])
    link = max(sum(b.values()) for b in m["bytes_sent_per_rank"]) * 8 / W_BITS
    return {"auc": m["auc"], "logloss": m["logloss"], "examples": m["examples"],
            "dense_bytes_per_example": sum(per.get(k, 0.0) for k in DENSE_KINDS),
            "sparse_bytes_per_example": sum(per.get(k, 0.0) for k in SPARSE_KINDS),
            "bytes_per_example": per,
            "link_us_per_example_10Gbps": link / ex * 1e6,
            "modeled_us_per_example_10Gbps": (busiest + link) / ex * 1e6,
            "easgd_rounds": m.get("easgd_rounds"), "easgd_wait_seconds": m.get("easgd_wait_seconds")}


def targets(s: dict) -> list[str]:
    """One line per target of the issue, met or missed, from the summaries ``s[sync][compress]``."""
    out = []
    a = s.get("allreduce", {})
    if "none" in a and "bf16" in a:
        n, b = a["none"]["bytes_per_example"], a["bf16"]["bytes_per_example"]
        ratios = {k: b[k] / n[k] for k in ("dense_allreduce", "sparse_rows", "sparse_grads") if n.get(k)}
        d_auc = a["bf16"]["auc"] - a["none"]["auc"]
        ok = all(abs(r - 0.5) < 0.01 for r in ratios.values()) and abs(d_auc) <= 0.0005
        out.append(f"bf16: bytes ratios {', '.join(f'{k} {r:.3f}' for k, r in ratios.items())}; AUC "
                   f"{d_auc:+.5f} vs none (target: 0.5 and within 0.0005) -> {'met' if ok else 'MISSED'}")
    if "none" in a and "int8" in a:
        r = a["none"]["bytes_per_example"]["sparse_rows"] / a["int8"]["bytes_per_example"]["sparse_rows"]
        d_auc = a["int8"]["auc"] - a["none"]["auc"]
        ok = r >= 3.5 and abs(d_auc) <= 0.002
        out.append(f"int8: served rows {r:.2f}x fewer bytes; AUC {d_auc:+.5f} vs none (target: >= 3.5x, within "
                   f"0.002) -> {'met' if ok else 'MISSED'}")
    for sync in ("easgd-2x2", "easgd-4x1"):
        if "none" in s.get(sync, {}) and "none" in a:
            d_auc = s[sync]["none"]["auc"] - a["none"]["auc"]
            goal = " (target: within 0.002)" if sync == "easgd-2x2" else ""
            verdict = (" -> met" if abs(d_auc) <= 0.002 else " -> MISSED") if goal else ""
            out.append(f"{sync}: AUC {d_auc:+.5f} vs allreduce{goal}{verdict}")
    return out


def report(s: dict) -> str:
    lines = [f"{'sync':<10} {'compress':<8} {'AUC':>7} {'logloss':>8} {'dense B/ex':>11} {'sparse B/ex':>12} "
             f"{'link us/ex':>11} {'model us/ex':>12}"]
    for sync, by in s.items():
        for c, r in by.items():
            lines.append(f"{sync:<10} {c:<8} {r['auc']:>7.4f} {r['logloss']:>8.4f} "
                         f"{r['dense_bytes_per_example']:>11.1f} {r['sparse_bytes_per_example']:>12.1f} "
                         f"{r['link_us_per_example_10Gbps']:>11.3f} {r['modeled_us_per_example_10Gbps']:>12.2f}")
    return "\n".join(lines + [""] + targets(s))


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.bench_ht", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rows", type=int, default=400_000, help="synthetic training examples (400000)")
    p.add_argument("--syncs", default=",".join(SYNCS), help=f"subset of {','.join(SYNCS)}")
    p.add_argument("--compress", default=",".join(COMPRESS), help="subset of none,bf16,int8")
    p.add_argument("--easgd-every", type=int, default=4)
    p.add_argument("--out", default=str(RESULTS / "ht.json"))
    a = p.parse_args(argv)
    data = ["--rows", str(a.rows), "--fields", "8", "--vocab-per-field", "20000", "--embedding-dim", "16",
            "--batch-size", "8192", "--minibatch-size", "512", "--ranks-per-node", "2",
            "--easgd-every", str(a.easgd_every)]
    raw, summary = {}, {}
    with tempfile.TemporaryDirectory(prefix="hps-bench-ht-") as tmp:
        for sync in a.syncs.split(","):
            for c in a.compress.split(","):
                m = run_job(a.ranks, [*data, *SYNCS[sync], "--compress", c], Path(tmp))
                raw.setdefault(sync, {})[c] = m
                summary.setdefault(sync, {})[c] = summarise(m)
                print(f"{sync} {c}: AUC {m['auc']:.4f}", flush=True)
    text = report(summary)
    print(text)
    write_result(a.out, "bench_ht", argv, {"ranks": a.ranks, "rows": a.rows, "link_bits_per_s": W_BITS,
                                           "summary": summary, "targets": targets(summary), "metrics": raw})
    return 0


if __name__ == "__main__":
    sys.exit(main())
