"""``python -m hps.profile``: the FAE profiler's command line (its only argument parser).

Exit codes as ``python -m hps.train``: 0 done, 2 bad input, 1 failure.
"""

from __future__ import annotations

import argparse
import sys

from .._argparse import ArgumentParser
from ..config import FORMATS, DataConfig, ModelOptions, parse_bytes
from ..errors import HpsError, InvalidInputError
from ._estimate import CHUNK_ENTRIES, CHUNKS
from ._profile import profile, row_bytes_of, write_profile


def default_row_bytes() -> int:
    """HBM-PS bytes of one row of the trainer's default model (``ModelOptions()``)."""
    from ..model import MODELS, make_sparse_optimizer

    m = ModelOptions()
    width = make_sparse_optimizer(m.sparse_optimizer, m.lr).row_width(m.embedding_dim + MODELS[m.model].first_order)
    return row_bytes_of(width)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(prog="python -m hps.profile", error_prefix="hps.profile",
                                description="FAE profiler: sample the input, log key accesses, estimate the hot-set "
                                            "size per threshold (Student-t interval) and pick the threshold "
                                            "that fits --hot-bytes; write the hot keys as HDF5.")
    S = argparse.SUPPRESS
    p.add_argument("--data", default=S, help="training data file")
    p.add_argument("--format", choices=FORMATS, default=S,
                   help="data format (default: told by the --data file names; synthetic without --data)")
    p.add_argument("--hot-bytes", required=True, help="HBM-PS bytes for hot rows (512MiB, 2g, bytes; 0: none)")
    p.add_argument("--row-bytes", type=int, default=None,
                   help="bytes of one hot row: 4 x the row floats the trainer prints + 8 for the key "
                        "(default: the default model's row)")
    p.add_argument("--sample-rate", type=float, default=5.0, help="percent of the input read (5)")
    p.add_argument("--confidence", type=float, default=0.999, help="interval confidence (0.999)")
    p.add_argument("--chunks", type=int, default=CHUNKS, help=f"logger chunks drawn, n ({CHUNKS})")
    p.add_argument("--chunk-entries", type=int, default=CHUNK_ENTRIES, help=f"entries per chunk, m ({CHUNK_ENTRIES})")
    p.add_argument("--exact", action="store_true", help="also count the whole data: the actual hot size")
    p.add_argument("--seed", type=int, default=0, help="sampler seed; synthetic data's seed too (0)")
    p.add_argument("--out", required=True, help="profile file to write (HDF5)")
    g = p.add_argument_group("synthetic data and formats (as python -m hps.train)")
    for flag, typ in (("--rows", int), ("--fields", int), ("--vocab-per-field", int), ("--zipf", float),
                      ("--n-dense", int), ("--libsvm-fields", int), ("--label-column", str)):
        g.add_argument(flag, type=typ, default=S)
    g.add_argument("--batch-size", type=int, default=16_384,
                   help="synthetic: the training run's --batch-size (the data is generated per batch)")
    return p


def run(args) -> int:
    from ..train._feed import format_options

    data_opts = {k: getattr(args, k) for k in ("format", "data", "rows", "fields", "vocab_per_field", "zipf",
                                                "n_dense", "libsvm_fields", "label_column") if hasattr(args, k)}
    d = DataConfig(**data_opts)
    row_bytes = args.row_bytes if args.row_bytes is not None else default_row_bytes()
    prof = profile(d.data, d.format, parse_bytes(args.hot_bytes), row_bytes, args.sample_rate, args.confidence,
                   args.exact, args.seed, format_options(d, args.seed, args.batch_size), args.chunks,
                   args.chunk_entries)
    write_profile(args.out, prof)
    print(prof.describe())
    print(f"profile written to {args.out}")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except HpsError as e:
        print(f"hps.profile: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, (InvalidInputError, ValueError)) else 1
