"""Criteo TSV reader (Kaggle Display Advertising Challenge ``train.txt`` layout).

Each line: ``label \\t I1 … I13 \\t C1 … C26`` — a 0/1 label, 13 integer counts and 26 categoricals
written as 8 hex digits (a 32-bit hash); any feature may be empty (missing). Per example:

- ``dense`` (13 columns, float32): log1p(max(x, 0)), a missing count gives 0.
- categorical field i (0..25): key ``make_keys(i, int(Ci, 16))``; a missing Ci gets the field's
  reserved missing key ``make_keys(i, MISSING_VALUE)`` (MISSING_VALUE = 2**32 + 1), so every example
  has 26 keys.
- with ``int_as_categorical=True`` the counts also become fields 26..38 (39 keys per example): key of
  floor(log2(1 + x)) for x >= 0, ``MISSING_VALUE`` when empty, ``NEGATIVE_VALUE`` when x < 0.
"""

from __future__ import annotations

import numpy as np

from ._batch import FIELD_SHIFT, FixedBatch
from ._chunks import (BAD_COLUMNS, BAD_HEX, BAD_LABEL, BAD_NUMBER, DEFAULT_CHUNK_BYTES,
                      DEFAULT_MAX_MALFORMED, MISSING_VALUE, TextReader)
from ._criteo_kernels import hex_digits, log1p_table, parse_criteo_keys

#: Number of integer (dense) and categorical columns of the Criteo layout.
N_INT = 13
N_CAT = 26
#: Bucket value of a negative integer feature when ints are bucketized. Written into keys: never change.
NEGATIVE_VALUE = (1 << 32) + 2

_CODES = np.array([BAD_COLUMNS, BAD_LABEL, BAD_NUMBER, BAD_HEX], dtype=np.int32)
#: Counts whose log1p the kernel looks up instead of computing (the same float32 values).
LOG1P_TABLE_SIZE = 4096


class CriteoReader(TextReader):
    """Streams ``Batch``es from Criteo TSV file(s). Not thread-safe (one iteration at a time).

    path: a file or a list of files (read in order, batches run across file ends).
    batch_size: examples per batch; shard=(index, n_shards): read only that shard of the files.
    strict: raise ``InvalidInputError`` (naming file:line and why) at the first malformed line,
    instead of counting and skipping it; max_malformed: the fraction of lines a pass may skip (see
    ``TextReader``). int_as_categorical: also bucketize I1..I13 into fields 26..38. readers: threads
    parsing in parallel (the same batches for any number).
    """

    format_description = ("Criteo TSV: 40 tab-separated columns, a 0/1 label, 13 integer counts, "
                          "26 hex categoricals")

    def __init__(self, path, batch_size: int, shard=(0, 1), strict: bool = False,
                 int_as_categorical: bool = False, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_malformed: float = DEFAULT_MAX_MALFORMED, readers: int = 1):
        super().__init__(path, batch_size, shard, strict, chunk_bytes, max_malformed, readers)
        self.int_as_categorical = bool(int_as_categorical)
        self.n_fields = N_CAT + (N_INT if self.int_as_categorical else 0)
        self.n_dense = N_INT
        self._hex, self._log1p = hex_digits(), log1p_table(LOG1P_TABLE_SIZE)

    def _parse(self, buf: np.ndarray, n_lines: int, bad_line: np.ndarray, bad_code: np.ndarray):
        labels = np.empty(n_lines, dtype=np.float32)
        dense = np.empty((n_lines, N_INT), dtype=np.float32)
        keys = np.empty((n_lines, self.n_fields), dtype=np.uint64)
        counts = parse_criteo_keys(buf, self.int_as_categorical, self.strict, np.uint64(MISSING_VALUE),
                                   np.uint64(NEGATIVE_VALUE), _CODES, self._hex, self._log1p, FIELD_SHIFT,
                                   labels, dense, keys, bad_line, bad_code)
        n_ok = counts[1]
        return counts, FixedBatch(labels[:n_ok], dense[:n_ok], keys[:n_ok])
