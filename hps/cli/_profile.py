"""``python -m hps.profile``: the FAE profiler's argument parser (the command runs in
``hps.profile._main``).

Exit codes as ``python -m hps.train``: 0 done, 2 bad input, 1 failure.
"""

from __future__ import annotations

import argparse

from .._argparse import ArgumentParser
from .._options import CHUNK_ENTRIES, CHUNKS, DEFAULT_BATCH_SIZE, PROFILE_CONFIDENCE, PROFILE_SAMPLE_RATE
from ..config import FORMATS


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m hps.profile", error_prefix="hps.profile",
                                description="FAE profiler: sample the input, log key accesses, estimate the hot-set "
                                            "size per threshold (Student-t interval) and pick the threshold "
                                            "that fits --hot-bytes; write the hot keys as HDF5.")
    S = argparse.SUPPRESS
    p.add_argument("--data", default=S, help="training data file")
    p.add_argument("--format", choices=FORMATS, default=S,
                   help="data format (default: told by the --data file names, .csv .parquet .libsvm .libfm, or "
                        "a .txt/.tsv file's first line; synthetic without --data)")
    p.add_argument("--hot-bytes", required=True, help="HBM-PS bytes for hot rows (512MiB, 2g, bytes; 0: none)")
    p.add_argument("--row-bytes", type=int, default=None,
                   help="bytes of one hot row: 4 x the row floats the trainer prints + 8 for the key "
                        "(default: the default model's row)")
    p.add_argument("--sample-rate", type=float, default=PROFILE_SAMPLE_RATE,
                   help=f"percent of the input read ({PROFILE_SAMPLE_RATE:g})")
    p.add_argument("--confidence", type=float, default=PROFILE_CONFIDENCE,
                   help=f"interval confidence ({PROFILE_CONFIDENCE})")
    p.add_argument("--chunks", type=int, default=CHUNKS, help=f"logger chunks drawn, n ({CHUNKS})")
    p.add_argument("--chunk-entries", type=int, default=CHUNK_ENTRIES, help=f"entries per chunk, m ({CHUNK_ENTRIES})")
    p.add_argument("--exact", action="store_true", help="also count the whole data: the actual hot size")
    p.add_argument("--seed", type=int, default=0, help="sampler seed; synthetic data's seed too (0)")
    p.add_argument("--out", required=True, help="profile file to write (HDF5)")
    g = p.add_argument_group("synthetic data and formats (as python -m hps.train)")
    for flag, typ in (("--rows", int), ("--fields", int), ("--vocab-per-field", int), ("--zipf", float),
                      ("--n-dense", int), ("--libsvm-fields", int), ("--label-column", str)):
        g.add_argument(flag, type=typ, default=S)
    # the columns as the training run reads them, or its keys are not the profile's
    g.add_argument("--ignore-columns", default=S, help="csv, parquet: columns to drop, comma separated")
    g.add_argument("--dense-columns", default=S, help="csv, parquet: numeric columns, comma separated")
    g.add_argument("--categorical-columns", default=S, help="csv, parquet: the fields in order, comma separated")
    g.add_argument("--int-as-categorical", action="store_true", default=S, help="criteo: also bucketize the integers")
    g.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help="synthetic: the training run's --batch-size (the data is generated per batch)")
    return p
