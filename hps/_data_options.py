"""Which data option belongs to which format, each format's defaults, and the format of a job whose
``--format`` is not given: the checks of ``hps.config.DataConfig``.

A job reads one format. ``--format`` unset: inferred from the file names of ``--data`` and
``--eval-data`` (``hps.data.infer_format``: ``.parquet``, ``.csv``, ``.libsvm``, Criteo's ``.txt`` by
its first line, …), synthetic without ``--data``; names that do not tell are an error saying to pass
``--format``. An option given to a format it does not belong to (``--rows`` with a CSV file,
``--label-column`` with synthetic data) is an error naming it, not silently ignored.
"""

from __future__ import annotations

from .data import DEFAULT_MAX_MALFORMED
from .errors import InvalidInputError

FORMATS = ("synthetic", "criteo", "libsvm", "csv", "parquet")
_FILES, _TABLES = FORMATS[1:], ("csv", "parquet")
#: The synthetic generator's defaults (a DataConfig of another format leaves these options unset).
SYNTHETIC_DEFAULTS = {"rows": 200_000, "fields": 8, "vocab_per_field": 20_000, "zipf": 1.1, "n_dense": 4, "drift": 0.0}
#: The defaults of the file formats' options (unset for the formats they do not belong to).
FILE_DEFAULTS = {"max_malformed": DEFAULT_MAX_MALFORMED, "label_column": "click", "dense_transform": "none"}
#: Data option -> the formats it belongs to.
OPTION_FORMATS = {**dict.fromkeys(SYNTHETIC_DEFAULTS, FORMATS[:1]),
                  **dict.fromkeys(("data", "eval_data", "strict", "max_malformed"), _FILES),
                  **dict.fromkeys(("label_column", "ignore_columns", "dense_columns", "categorical_columns",
                                   "dense_transform"), _TABLES),
                  "int_as_categorical": ("criteo",), "libsvm_fields": ("libsvm",)}


def _given(value) -> bool:
    return value is not None and value is not False and value != ()


def resolve_format(d) -> None:
    """In place on the DataConfig ``d``: lists as tuples; ``format`` inferred when None; an option of
    another format raises InvalidInputError naming it; unset options of this format take their
    defaults. Reads the first line of ``.txt`` / ``.tsv`` data files when it infers the format."""
    for name in ("data", "eval_data", "ignore_columns", "dense_columns", "categorical_columns"):
        if isinstance(getattr(d, name), list):
            setattr(d, name, tuple(getattr(d, name)))
    inferred = d.format is None
    if inferred:
        from .data import infer_format

        d.format = infer_format(d.data, d.eval_data) if d.data else "synthetic"
    if d.format not in FORMATS:
        raise InvalidInputError(f"format must be one of {', '.join(FORMATS)}; got {d.format!r}")
    for name, owners in OPTION_FORMATS.items():
        if d.format not in owners and _given(getattr(d, name)):
            which = "data files (--format " + ", ".join(owners) + ")" if owners == _FILES else \
                "--format " + " and ".join(owners)
            how = "" if not inferred else " (no --data given)" if not d.data else " (inferred from the --data file names)"
            raise InvalidInputError(f"--{name.replace('_', '-')} is an option of {which}, not of --format "
                                    f"{d.format}{how}")
    defaults = SYNTHETIC_DEFAULTS if d.format == "synthetic" else FILE_DEFAULTS
    for name, value in defaults.items():
        if d.format in OPTION_FORMATS[name] and getattr(d, name) is None:
            setattr(d, name, value)
