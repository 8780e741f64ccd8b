"""``python -m hps.convert``: the command (reports, turns errors into exit codes; its parser: ``hps.cli``)."""

from __future__ import annotations

import sys
from pathlib import Path

from .._argparse import comma_names
from ..cli import EXIT_BAD_INPUT, EXIT_FAILED, build_convert_parser
from ..config import DataConfig
from ..data import format_options
from ..errors import HpsError, InvalidInputError
from ._write import convert


def main(argv=None) -> int:
    """``python -m hps.convert``; returns the exit code (2 bad input, 1 failure)."""
    a = build_convert_parser().parse_args(argv)
    try:
        data = a.data[0] if a.data and len(a.data) == 1 else (tuple(a.data) if a.data else None)
        d = DataConfig(format=a.format, data=data, rows=a.rows, fields=a.fields, vocab_per_field=a.vocab_per_field,
                       zipf=a.zipf, n_dense=a.n_dense, drift=a.drift, label_column=a.label_column,
                       ignore_columns=comma_names(a.ignore_columns),
                       dense_columns=comma_names(a.dense_columns),
                       categorical_columns=comma_names(a.categorical_columns) if a.categorical_columns else None,
                       int_as_categorical=a.int_as_categorical, libsvm_fields=a.libsvm_fields,
                       strict=a.strict, max_malformed=a.max_malformed, readers=a.readers,
                       dense_transform=a.dense_transform)
        opts = format_options(d, a.seed, a.batch_size)
        if a.dense_stats_from is not None:
            if d.dense_transform != "standardize":
                raise InvalidInputError("--dense-stats-from gives the statistics of --dense-transform standardize: "
                                        "add it")
            opts["dense_stats"] = training_dense_stats(a.dense_stats_from)
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


def training_dense_stats(path) -> dict:
    """The dense statistics another job standardized with: those of an export (its ``model.json``: the
    training data's) or of data converted with ``--dense-transform standardize``. InvalidInputError
    when ``path`` is neither, or holds none."""
    from ..data._converted import converted_source, is_converted
    from ..formats._manifest import EXPORT_META, read_checked

    p = Path(path)
    if (p / EXPORT_META).is_file():
        meta, _ = read_checked(p / EXPORT_META, "export")
        stats, what = (meta.get("data") or {}).get("options", {}).get("dense_stats"), "export's training data"
    else:
        try:
            converted = p.exists() and is_converted(p)
        except InvalidInputError:
            converted = False
        if not converted:
            raise InvalidInputError(f"--dense-stats-from {p}: neither an export (no {EXPORT_META}) nor data "
                                    "written by python -m hps.convert")
        stats, what = converted_source(p)["options"].get("dense_stats"), "conversion"
    if stats is None:
        raise InvalidInputError(f"--dense-stats-from {p}: the {what} was not standardized (no "
                                "--dense-transform standardize): it holds no dense statistics")
    return stats


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
