"""``python -m hps.convert``: its argument parser (the command runs in ``hps.convert._main``)."""

from __future__ import annotations

from .._argparse import ArgumentParser
from .._options import DEFAULT_BATCH_SIZE
from ..config import FORMATS
from ..data import DEFAULT_MAX_MALFORMED, DENSE_TRANSFORMS
from ..data._converted import COMPRESSIONS, DEFAULT_MAX_SHARDS

#: Formats a conversion reads (converted data is read as it is).
SOURCES = tuple(f for f in FORMATS)


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m hps.convert",
        description="Read data in any format hps reads and write it as Parquet with the keys already hashed; "
                    "train from it with --format parquet --data OUT (the same model as from the source).")
    p.add_argument("--format", choices=SOURCES, required=True, help="format of the source data")
    p.add_argument("--data", nargs="+", help="source files, directories or globs, plain, .gz or .zst")
    p.add_argument("--out", required=True, help="directory to write (missing, empty, or an earlier conversion)")
    p.add_argument("--rows-per-file", type=int, help="rows per Parquet file (default: 4,194,304)")
    p.add_argument("--max-data-shards", type=int, default=DEFAULT_MAX_SHARDS, metavar="K",
                   help="--data-shards (or ranks) up to K read exactly the source's shards from OUT, so "
                        f"training from OUT equals training from the source ({DEFAULT_MAX_SHARDS})")
    p.add_argument("--compression", choices=COMPRESSIONS, default="none",
                   help="page compression: none reads fastest, the others make smaller files (none)")
    p.add_argument("--readers", type=int, default=1, metavar="N", help="threads parsing the source (1)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g = p.add_argument_group("the reader's options (as python -m hps.train has them; an option of another "
                             "format is an error)")
    g.add_argument("--label-column", help="csv, parquet: label column (click)")
    g.add_argument("--ignore-columns", default="", help="csv, parquet: columns to drop, comma separated")
    g.add_argument("--dense-columns", default="", help="csv, parquet: numeric columns, comma separated")
    g.add_argument("--categorical-columns", help="csv, parquet: the fields in order, comma separated")
    g.add_argument("--dense-transform", choices=DENSE_TRANSFORMS,
                   help="csv, parquet: transform of the dense columns, stored transformed (none)")
    g.add_argument("--dense-stats-from", metavar="PATH",
                   help="with --dense-transform standardize: the statistics of an export's training data "
                        "(--export DIR) or of a conversion, not this data's own (eval and scoring data)")
    g.add_argument("--int-as-categorical", action="store_true", help="criteo: also bucketize the integers")
    g.add_argument("--libsvm-fields", type=int, help="libsvm: positional fields")
    g.add_argument("--strict", action="store_true", help="stop at the first malformed line")
    g.add_argument("--max-malformed", type=float, metavar="FRACTION",
                   help=f"stop when more than this fraction of the lines are malformed ({DEFAULT_MAX_MALFORMED})")
    g.add_argument("--rows", type=int, help="synthetic: examples (200000)")
    g.add_argument("--fields", type=int, help="synthetic: fields (8)")
    g.add_argument("--vocab-per-field", type=int, help="synthetic: values per field (20000)")
    g.add_argument("--zipf", type=float, help="synthetic: Zipf exponent (1.1)")
    g.add_argument("--n-dense", type=int, help="synthetic: dense features (4)")
    g.add_argument("--drift", type=float, help="synthetic: popularity drift (0)")
    g.add_argument("--seed", type=int, default=0, help="synthetic: the seed of the training job (0)")
    g.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help="synthetic: the --batch-size of the training job (its data is made in blocks of it)")
    g.add_argument("--split", choices=("train", "eval"), default="train",
                   help="synthetic: the training rows, or the eval split the trainer evaluates on")
    return p
