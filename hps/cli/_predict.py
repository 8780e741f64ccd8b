"""``python -m hps.predict``: its argument parser (the command runs in ``hps.predict._main``)."""

from __future__ import annotations

from .._argparse import ArgumentParser
from ..data import DEFAULT_MAX_MALFORMED


def build_predict_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m hps.predict",
        description="Score raw data with a model exported by python -m hps.train --export DIR: one "
                    "probability per valid example, in input order.")
    p.add_argument("--model-dir", required=True, help="the export directory (--export of the training job), a "
                   "checkpoint, or a --checkpoint-dir (its latest checkpoint: the best one after --early-stop)")
    p.add_argument("--data", nargs="+", required=True,
                   help="data in the training format: files, directories or globs, plain, .gz or .zst")
    p.add_argument("--out", required=True, help="CSV file to write: label,probability (probability only "
                   "for CSV/Parquet data without the label column)")
    p.add_argument("--unknown", choices=("init", "zero"), default="init",
                   help="row of a key the export lacks: the row training would have created for it "
                        "(init, what the training job's evaluation used) or zeros (init)")
    p.add_argument("--batch-size", type=int, default=65_536, help="examples scored at a time (65536)")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed line")
    p.add_argument("--max-malformed", type=float, default=DEFAULT_MAX_MALFORMED, metavar="FRACTION",
                   help=f"stop when more than this fraction of the lines are malformed ({DEFAULT_MAX_MALFORMED})")
    p.add_argument("--readers", type=int, default=1, metavar="N",
                   help="threads parsing the data in parallel; the same scores for any N (1)")
    return p
