"""The host side of a training job alone: ``python -m hps.train`` with a null device step that only
consumes each batch (its staged mini-batches are taken and dropped; no forward, backward or update), so
the read, prepare and place stages set the rate on any machine, with or without a GPU.

    python -m bench.bench_host                              # the device job's shape at 200,000 rows
    python -m bench.bench_host --rows 2000000 --mem-budget 32GB   # the GPU job of docs/gpu.md, whole
    python -m bench.bench_host --rows 2000000 --mem-budget 10GB   # the same on the 2-core VM (23.5 GiB)
    python -m bench.bench_host --out bench/results/host-<date>.json [any hps.train flag]
    python -m hps.convert --format synthetic --rows 1000000 --fields 26 --vocab-per-field 1000000 \
        --batch-size 65536 --out DIR && python -m bench.bench_host --format parquet --data DIR

The last pair is the job's data pre-hashed (``hps.convert``): the reader keeps up (it reads Parquet, it
does not generate), so prepare alone sets the rate. With ``--data`` the job's synthetic-only options
(``--rows``, ``--fields``, ``--vocab-per-field``) are left out.

Prints examples/s over the pipeline (``Trainer.fit``'s timed part), each stage's busy seconds and the
bottleneck; the target (``--device cpu``, 2 cores) is >= 1 M examples/s once the reader keeps up. The
train stage's busy time is the null step's (near 0): the rate is the host's. A ``--mem-budget`` above the
machine's memory is refused; on the 2-core VM the 2 M-row job peaks at ~8 GB with 10GB. Its 5.7 M keys
outgrow the CPU twin's default ``--hbm-budget`` (2 x (window + 1) working sets of the largest batch: 4.2 M rows), so
12 of its 31 batches evict, which a GPU holding the whole table would not. Extra arguments go to
``hps.train`` as they are (later ones win)."""

from __future__ import annotations

import sys

#: the job's synthetic data (options only ``--format synthetic`` takes), at a size a 2-core box runs in a minute
_DATA = ["--rows", "200000", "--fields", "26", "--vocab-per-field", "1000000"]
#: the job of the device comparison (bench/bench_device.py)
JOB = [*_DATA, "--batch-size", "65536", "--minibatch-size", "4096", "--hidden", "512,256", "--embedding-dim", "32",
       "--model", "ctr", "--sparse-optimizer", "adagrad", "--no-progress"]


def _null_step(self, w) -> float:
    """A device step that consumes a batch: it takes every staged mini-batch and does nothing with it."""
    for j in self.features.order(w):
        w.staged[j] = None
    return 0.0


def job_args(argv: list) -> list:
    """``hps.train``'s arguments: JOB, then ``argv`` (later ones win); with ``--data`` in ``argv`` JOB's
    synthetic-only options are left out (the data is given)."""
    return [*(JOB[len(_DATA):] if "--data" in argv else JOB), *argv]


def main(argv=None) -> int:
    from hps.cli import parse_config
    from hps.train._run import run
    from hps.train._trainer import Trainer

    argv = list(sys.argv[1:] if argv is None else argv)
    out = None
    if "--out" in argv:
        i = argv.index("--out")
        out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    Trainer._train_batch = _null_step   # this process only: the benchmark's own trainer
    m = run(parse_config(job_args(argv)))
    busy = ", ".join(f"{k} {v:.2f}" for k, v in m["stage_seconds"].items())
    print(f"host side (null device step): {m['examples_per_sec']:,.0f} examples/s over {m['examples']:,} "
          f"examples; stage busy seconds: {busy}; bottleneck {m['bottleneck']}")
    if out:
        from bench._jobs import write_result

        write_result(out, "bench_host", argv, {k: m[k] for k in ("examples_per_sec", "examples", "stage_seconds",
                                                                 "bottleneck", "hbm_fetched_rows", "table_rows")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
