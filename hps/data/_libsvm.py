"""libsvm / libFM reader: ``label idx:val idx:val …`` (spaces or tabs), CRLF tolerated.

Labels 1 -> 1 and 0 or -1 -> 0 (anything else is malformed). The format carries no field ids, so
fields are positional: the j-th feature of a line (0-based) belongs to field ``min(j, n_fields - 1)``
(Frappe has exactly 10 features per line, one per field). The key of a feature is
``make_keys(field, idx)`` and its weight is ``val``. ``n_fields`` defaults to the number of features
on the first valid line of the first file. There are no dense features (``n_dense = 0``).
"""

from __future__ import annotations

import numpy as np

from ..errors import InvalidInputError
from ._batch import Batch, check_n_fields, make_keys
from ._chunks import (BAD_FEATURE, BAD_LABEL, BAD_NUMBER, DEFAULT_CHUNK_BYTES,
                      DEFAULT_MAX_MALFORMED, TextReader, iter_line_chunks)
from ._parse_kernels import parse_libsvm
from ._sources import name_files, open_source

_CODES = np.array([BAD_LABEL, BAD_NUMBER, BAD_FEATURE], dtype=np.int32)
_FORMAT = ("libsvm/libFM: a label (1, 0 or -1), then space-separated idx:value features (idx an "
           "unsigned integer, value a float32 number)")
#: Bytes read to find the first valid line when ``n_fields`` is not given.
_PEEK_BYTES = 1 << 16


def _parse_chunk(buf: np.ndarray, cap: int, strict: bool, bad_line: np.ndarray, bad_code: np.ndarray):
    nnz_cap = int(np.count_nonzero(buf == 58))
    labels = np.empty(cap, dtype=np.float32)
    offsets = np.empty(cap + 1, dtype=np.int64)
    idx = np.empty(nnz_cap, dtype=np.uint64)
    val = np.empty(nnz_cap, dtype=np.float32)
    pos = np.empty(nnz_cap, dtype=np.int32)
    counts = parse_libsvm(buf, strict, _CODES, labels, offsets, idx, val, pos, bad_line, bad_code)
    return counts, labels, offsets, idx, val, pos


class LibsvmReader(TextReader):
    """Streams ``Batch``es from libsvm/libFM file(s). Not thread-safe (one iteration at a time).

    path: a file or a list of files; batch_size: examples per batch; shard=(index, n_shards);
    strict: raise at the first malformed line; max_malformed: the fraction of lines a pass may skip
    (see ``TextReader``); n_fields: positional fields (default: features on the first valid line);
    readers: threads parsing in parallel (the same batches for any number).
    """

    format_description = _FORMAT

    def __init__(self, path, batch_size: int, shard=(0, 1), strict: bool = False,
                 n_fields: int | None = None, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 max_malformed: float = DEFAULT_MAX_MALFORMED, readers: int = 1):
        super().__init__(path, batch_size, shard, strict, chunk_bytes, max_malformed, readers)
        if n_fields is None:
            self.n_fields = check_n_fields(self._first_line_width(), "features on the first valid "
                                           "libsvm line (the positional fields; set n_fields)")
        else:
            self.n_fields = check_n_fields(n_fields, "n_fields")
        self.n_dense = 0

    def _first_line_width(self) -> int:
        bad_line = np.empty(1, dtype=np.int64)
        bad_code = np.empty(1, dtype=np.int32)
        for path in self.paths:
            with open_source(path) as f:
                for buf, _, n in iter_line_chunks(f, _PEEK_BYTES):
                    (_, n_ok, _, _), _, offsets, *_ = _parse_chunk(buf, n, False, bad_line, bad_code)
                    if n_ok:
                        return max(1, int(offsets[1] - offsets[0]))
        raise InvalidInputError(f"no valid libsvm line in {name_files(self.paths)}; "
                                f"cannot infer n_fields; expected {_FORMAT}")

    def _parse(self, buf: np.ndarray, n_lines: int, bad_line: np.ndarray, bad_code: np.ndarray):
        counts, labels, offsets, idx, val, pos = _parse_chunk(buf, n_lines, self.strict, bad_line, bad_code)
        n_ok = counts[1]
        nnz = int(offsets[n_ok])
        field = np.minimum(pos[:nnz], np.int32(self.n_fields - 1))
        return counts, Batch(labels[:n_ok], np.zeros((n_ok, 0), dtype=np.float32),
                             make_keys(field, idx[:nnz]), field, val[:nnz], offsets[:n_ok + 1],
                             self.n_fields)
