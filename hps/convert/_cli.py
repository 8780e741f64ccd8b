"""``python -m hps.convert``: the command line (parses the arguments, reports, turns errors into exit codes)."""

from __future__ import annotations

import sys

from .._argparse import ArgumentParser
from ..config import FORMATS, DataConfig
from ..data import DEFAULT_MAX_MALFORMED, DENSE_TRANSFORMS, format_options
from ..errors import HpsError, InvalidInputError
from ._write import COMPRESSIONS, DEFAULT_MAX_SHARDS, convert

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1
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
    g.add_argument("--batch-size", type=int, default=16_384,
                   help="synthetic: the --batch-size of the training job (its data is made in blocks of it)")
    g.add_argument("--split", choices=("train", "eval"), default="train",
                   help="synthetic: the training rows, or the eval split the trainer evaluates on")
    return p


def _columns(text):
    return tuple(c.strip() for c in text.split(",") if c.strip()) if text else ()


def main(argv=None) -> int:
    """``python -m hps.convert``; returns the exit code (2 bad input, 1 failure)."""
    a = build_parser().parse_args(argv)
    try:
        data = a.data[0] if a.data and len(a.data) == 1 else (tuple(a.data) if a.data else None)
        d = DataConfig(format=a.format, data=data, rows=a.rows, fields=a.fields, vocab_per_field=a.vocab_per_field,
                       zipf=a.zipf, n_dense=a.n_dense, drift=a.drift, label_column=a.label_column,
                       ignore_columns=_columns(a.ignore_columns), dense_columns=_columns(a.dense_columns),
                       categorical_columns=_columns(a.categorical_columns) if a.categorical_columns else None,
                       int_as_categorical=a.int_as_categorical, libsvm_fields=a.libsvm_fields,
                       strict=a.strict, max_malformed=a.max_malformed, readers=a.readers,
                       dense_transform=a.dense_transform)
        opts = format_options(d, a.seed, a.batch_size)
        if a.format == "synthetic" and a.split == "eval":  # the eval split as a training set of its own rows
            opts = _eval_split(opts)
        bar = _bar(a.progress)
        try:
            man = convert(a.format, d.data, a.out, opts, rows_per_file=a.rows_per_file, max_shards=a.max_data_shards,
                          readers=a.readers, strict=a.strict, max_malformed=d.max_malformed,
                          compression=a.compression, progress=bar and bar.to)
        finally:
            if bar:
                bar.close()
    except (HpsError, OSError) as e:
        print(f"hps: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT if isinstance(e, InvalidInputError) else EXIT_FAILED
    skipped = f", {man['malformed']} malformed lines skipped" if man["malformed"] else ""
    print(f"hps: converted {man['rows']:,} examples ({a.format}{skipped}) into {len(man['files'])} file(s) in "
          f"{a.out}; train with --format parquet --data {a.out}")
    return 0


def _eval_split(opts: dict) -> dict:
    return dict(opts, split="eval")


class _Bar:
    """A tqdm bar of rows written (``to(rows)``)."""

    def __init__(self):
        from tqdm import tqdm

        self._t = tqdm(unit="ex", unit_scale=True, dynamic_ncols=True, leave=False)

    def to(self, rows: int) -> None:
        self._t.update(rows - self._t.n)

    def close(self) -> None:
        self._t.close()


def _bar(enabled: bool):
    return _Bar() if enabled else None
