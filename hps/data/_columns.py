"""Which column of a table (CSV header, Parquet schema) plays which part: one rule for both formats.

- the label: the column named ``label`` (None: no label column; every label reads 0 — for scoring
  data that has none);
- dense features: the columns of ``dense_columns``, in that order;
- categorical fields: the columns of ``categorical_columns`` in that order (field ids 0, 1, …), or by
  default every other column not in ``ignore_columns``, in table order;
- every remaining column is ignored.

A name that is not a column of the table, or a column given two parts, raises InvalidInputError.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError

# Column kinds understood by the parse kernels (``parse_csv``) and ``_arrow``. Kernel arguments: never
# renumber without changing the kernels.
LABEL, DENSE, CATEGORICAL, IGNORE = 0, 1, 2, 3


@dataclass(frozen=True)
class ColumnPlan:
    """The part of every column: ``kind`` (C,) int32 (LABEL, DENSE, CATEGORICAL, IGNORE) and ``slot``
    (C,) int32 (its column in ``dense`` / its field id); ``categorical`` and ``dense`` name the fields
    and dense features in order; ``label`` the label column or None."""

    kind: np.ndarray
    slot: np.ndarray
    categorical: tuple[str, ...]
    dense: tuple[str, ...]
    label: str | None


def plan_columns(header, label, dense_columns=(), ignore_columns=(), categorical_columns=None,
                 where: str = "the data") -> ColumnPlan:
    """The :class:`ColumnPlan` of the table with column names ``header`` (see the module docstring);
    ``where`` names the table in errors."""
    header = list(header)
    if len(set(header)) != len(header):
        raise InvalidInputError(f"{where}: duplicate column names in {header}")
    dense = list(dense_columns or ())
    ignore = list(ignore_columns or ())
    cats = None if categorical_columns is None else list(categorical_columns)
    roles = [("label", [label] if label is not None else []), ("dense", dense), ("ignore", ignore),
             ("categorical", cats or [])]
    for what, cols in roles:
        missing = [c for c in cols if c not in header]
        if missing:
            raise InvalidInputError(f"{what} column(s) {missing} not in the columns of {where}: {header}")
        if len(set(cols)) != len(cols):
            raise InvalidInputError(f"{what} columns {cols} name a column twice")
    seen: dict = {}
    for what, cols in roles:
        for c in cols:
            if c in seen:
                raise InvalidInputError(f"column {c!r} is given as {seen[c]} and as {what}; give each "
                                        "column one part")
            seen[c] = what
    if cats is None:
        cats = [c for c in header if c not in seen]
    kind = np.full(len(header), IGNORE, dtype=np.int32)
    slot = np.zeros(len(header), dtype=np.int32)
    pos = {c: i for i, c in enumerate(header)}
    if label is not None:
        kind[pos[label]] = LABEL
    for j, c in enumerate(dense):
        kind[pos[c]], slot[pos[c]] = DENSE, j
    for j, c in enumerate(cats):
        kind[pos[c]], slot[pos[c]] = CATEGORICAL, j
    return ColumnPlan(kind, slot, tuple(cats), tuple(dense), label)
