"""Which format a data file is in, from its name and, where the name does not say, its first line.

``infer_format(*paths)``: every file the paths expand to (``expand_paths``: files, directories, globs)
is classified by its name, a compression suffix (``.gz``, ``.zst``) stripped first:

- ``.parquet`` / ``.pq`` -> parquet; ``.csv`` -> csv; ``.libsvm`` / ``.libfm`` / ``.svm`` -> libsvm;
- ``.txt`` / ``.tsv`` (Criteo's ``train.txt``, but also anything else) -> its first line decides:
  40 tab-separated columns led by a 0/1 label is criteo, a label followed by ``idx:value`` features
  is libsvm, anything else is not known;
- any other name is not known.

Every file must be known and all must agree, else the answer is None (``required=False``) or one
InvalidInputError naming the file and saying to pass ``--format``.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import InvalidInputError
from ._criteo import N_CAT, N_INT
from ._sources import COMPRESSIONS, expand_paths, open_source

#: File name suffix (compression stripped) -> format; None: the first line decides (``_probe``).
SUFFIX_FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".libsvm": "libsvm",
                  ".libfm": "libsvm", ".svm": "libsvm", ".txt": None, ".tsv": None}
#: Bytes read from the start of a file whose first line decides its format.
PROBE_BYTES = 1 << 16
_LIBSVM_LINE = re.compile(rb"[+-]?[01](?:[ \t]+[0-9]+:[^ \t:]+)+[ \t]*\r?")
_HINT = "pass --format criteo, libsvm, csv or parquet"


def _suffix(path: Path) -> str:
    name = path.name.lower()
    for ext in COMPRESSIONS:
        if name.endswith(ext):
            name = name[: -len(ext)]
    return Path(name).suffix


def _probe(path: Path) -> str | None:
    """criteo / libsvm from the first line of ``path`` (decompressed), or None."""
    with open_source(path) as f:
        line = f.read(PROBE_BYTES).split(b"\n", 1)[0]
    cols = line.rstrip(b"\r").split(b"\t")
    if len(cols) == 1 + N_INT + N_CAT and cols[0] in (b"0", b"1"):
        return "criteo"
    if _LIBSVM_LINE.fullmatch(line):
        return "libsvm"
    return None


def format_of(path) -> str | None:
    """The format of the one file ``path`` (module docstring), or None when neither its name nor its
    first line says."""
    path = Path(path)
    suffix = _suffix(path)
    if suffix not in SUFFIX_FORMATS:
        return None
    return SUFFIX_FORMATS[suffix] or _probe(path)


def infer_format(*paths, required: bool = True) -> str | None:
    """The one format of every file of ``paths`` (each a path, a directory, a glob, a list of them, or
    None: skipped). Without an answer (a file of no known format, or files of two formats): None when
    not ``required``, else InvalidInputError naming the file. A missing file raises
    DataFileNotFoundError."""
    first: dict[str, Path] = {}
    for path in paths:
        for f in expand_paths(path) if path else ():
            fmt = format_of(f)
            if fmt is None:
                if not required:
                    return None
                raise InvalidInputError(f"cannot tell the data format of {f} from its name or first line: {_HINT}")
            first.setdefault(fmt, f)
    if len(first) > 1:
        if not required:
            return None
        (a, fa), (b, fb) = list(first.items())[:2]
        raise InvalidInputError(f"the data files are of different formats ({fa} reads as {a}, {fb} as {b}): "
                                f"{_HINT}")
    return next(iter(first), None)
