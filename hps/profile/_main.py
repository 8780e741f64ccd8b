"""``python -m hps.profile``: the FAE profiler's command (its parser: ``hps.cli``).

Exit codes as ``python -m hps.train``: 0 done, 2 bad input, 1 failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .._argparse import comma_names
from ..cli import build_profile_parser, check_writable
from ..config import DataConfig, ModelOptions, parse_bytes
from ..data import format_options
from ..errors import HpsError, InvalidInputError
from ._profile import profile, row_bytes_of, write_profile


def default_row_bytes() -> int:
    """HBM-PS bytes of one row of the trainer's default model (``ModelOptions()``)."""
    from ..model import MODELS, make_sparse_optimizer

    m = ModelOptions()
    width = make_sparse_optimizer(m.sparse_optimizer, m.lr).row_width(m.embedding_dim + MODELS[m.model].first_order)
    return row_bytes_of(width)


def run(args) -> int:
    data_opts = {k: getattr(args, k) for k in ("format", "data", "rows", "fields", "vocab_per_field", "zipf",
                                                "n_dense", "libsvm_fields", "label_column", "int_as_categorical")
                 if hasattr(args, k)}
    for k in ("ignore_columns", "dense_columns", "categorical_columns"):  # comma separated, as hps.train's
        if hasattr(args, k):
            data_opts[k] = comma_names(getattr(args, k))
    d = DataConfig(**data_opts)
    check_writable("--out", Path(args.out), is_dir=False)   # before the profiling, not after it
    row_bytes = args.row_bytes if args.row_bytes is not None else default_row_bytes()
    prof = profile(d.data, d.format, parse_bytes(args.hot_bytes), row_bytes, args.sample_rate, args.confidence,
                   args.exact, args.seed, format_options(d, args.seed, args.batch_size), args.chunks,
                   args.chunk_entries)
    write_profile(args.out, prof)
    print(prof.describe())
    print(f"profile written to {args.out}")
    return 0


def main(argv=None) -> int:
    args = build_profile_parser().parse_args(argv)
    try:
        return run(args)
    except HpsError as e:
        print(f"hps.profile: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, (InvalidInputError, ValueError)) else 1
