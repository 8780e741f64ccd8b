"""Reader throughput: hps's readers against pyarrow doing the same column work, in the same run.

Run: ``pytest bench/bench_readers.py --benchmark-only`` (``HPS_BENCH_READER_ROWS``, default 200,000
rows per file). Files are generated in a temporary folder: Criteo-like TSV, Frappe-like libsvm,
Avazu-like CSV, each plain and ``.gz``, and Parquet with uncompressed and gzip pages. Per case:
rows/s and MB/s (bytes of the file as stored) of

- **hps**: ``open_dataset(...).batches()`` — parse, hash every feature into its key, build the CSR
  ``Batch``es (Numba kernels over byte chunks; Parquet through pyarrow + hps's column work);
- **pyarrow (same work)**: ``pyarrow.csv.open_csv`` streaming record batches (one thread, columns
  typed up front) followed by the same column work into the same ``Batch``es: labels, dense
  features (Criteo: log1p), keys ``make_keys(field, value)`` with the same values (Criteo: hex of the
  categoricals; CSV: FNV-1a of the text, ``hps.data._parquet.arrow_examples``; libsvm: ``idx`` of every
  ``idx:val``) — so both paths end with the same keys, which the benchmark checks;
- **pyarrow (decode only)**: the pyarrow reader alone (CSV streaming / ``ParquetFile.iter_batches``),
  no keys: what splitting and typing the columns costs.

Parquet has no hand-written kernel: hps's reader *is* pyarrow + the same column work, so its "same
work" peer measures only hps's rebatching; pyarrow decodes Parquet with its own threads in both.

``ratio_vs_same_work`` = pyarrow-same-work seconds / hps seconds (> 1: hps is faster).
"""

from __future__ import annotations

import gzip
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from numba import njit

from hps.data import MISSING_VALUE, Batch, make_keys, open_dataset
from hps.data._batch import FixedBatch
from hps.data._columns import plan_columns
from hps.data._parquet import arrow_examples, text_buffers

ROWS = int(os.environ.get("HPS_BENCH_READER_ROWS", 200_000))
BATCH = 4096
#: Rows of a streaming pyarrow record batch (about the bytes of one hps chunk).
PEER_BLOCK_BYTES = 16 << 20


def _criteo(rng, n):
    ints = rng.integers(0, 1000, (n, 13)).astype(str)
    ints[rng.random((n, 13)) < 0.2] = ""
    cats = np.char.mod("%08x", rng.integers(0, 2**32, (n, 26)))
    cats[rng.random((n, 26)) < 0.1] = ""
    lab = rng.integers(0, 2, (n, 1)).astype(str)
    rows = np.concatenate([lab, ints, cats.astype(str)], axis=1)
    return "\n".join("\t".join(r) for r in rows) + "\n"


def _libsvm(rng, n):
    idx = rng.integers(0, 5000, (n, 10)) + np.arange(10) * 5000
    lab = np.where(rng.random(n) < 0.33, "1", "-1")
    return "".join(f"{l} " + " ".join(f"{i}:1" for i in r) + "\r\n" for l, r in zip(lab, idx))


CSV_COLS = [f"c{i}" for i in range(21)]


def _csv_table(rng, n):
    vals = np.char.mod("%x", rng.integers(0, 10_000, (n, 21)))
    return {"click": rng.integers(0, 2, n), **{c: vals[:, j].astype(str) for j, c in enumerate(CSV_COLS)}}


def _csv(rng, n):
    t = _csv_table(rng, n)
    rows = np.column_stack([t["click"].astype(str)] + [t[c] for c in CSV_COLS])
    return "click," + ",".join(CSV_COLS) + "\n" + "\n".join(",".join(r) for r in rows) + "\n"


TEXT = {"criteo": _criteo, "libsvm": _libsvm, "csv": _csv}
CASES = [(f, c) for f in ("criteo", "libsvm", "csv") for c in ("plain", "gz")] + \
        [("parquet", "none"), ("parquet", "gzip")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("readers")
    out = {}
    for fmt, make in TEXT.items():
        data = make(np.random.default_rng(0), ROWS).encode()
        out[fmt, "plain"] = d / f"data.{fmt}"
        out[fmt, "plain"].write_bytes(data)
        out[fmt, "gz"] = d / f"data.{fmt}.gz"
        out[fmt, "gz"].write_bytes(gzip.compress(data, compresslevel=6))
    table = pa.table(_csv_table(np.random.default_rng(0), ROWS))
    for comp in ("none", "gzip"):
        out["parquet", comp] = d / f"data.{comp}.parquet"
        pq.write_table(table, out["parquet", comp], compression=comp, row_group_size=65536)
    return out


# -- hps ---------------------------------------------------------------------------------------------------


def hps_read(path, fmt) -> Batch:
    ds = open_dataset(path, "parquet" if fmt == "parquet" else fmt, BATCH)
    parts = list(ds.batches())
    assert ds.stats.malformed == 0
    return parts


# -- pyarrow, the same column work -------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def _hex_strings(data, offsets, valid, missing, values, col):
    """Criteo categoricals: values[i, col] = the 1-8 hex digits of entry i, ``missing`` if null/empty."""
    for i in range(offsets.shape[0] - 1):
        a, b = offsets[i], offsets[i + 1]
        if not valid[i] or b == a:
            values[i, col] = missing
            continue
        v = np.uint64(0)
        for k in range(a, b):
            c = data[k]
            d = c - 48 if c <= 57 else (c - 87 if c >= 97 else c - 55)
            v = (v << np.uint64(4)) | np.uint64(d)
        values[i, col] = v


def _stream(path, delimiter, names, types):
    read = pacsv.ReadOptions(use_threads=False, block_size=PEER_BLOCK_BYTES,
                             **({"column_names": names} if names else {}))
    conv = pacsv.ConvertOptions(column_types=types, strings_can_be_null=True)
    return pacsv.open_csv(path, read_options=read, parse_options=pacsv.ParseOptions(delimiter=delimiter),
                          convert_options=conv)


CRITEO_NAMES = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]
CRITEO_TYPES = {"label": pa.int8(), **{f"I{i}": pa.int64() for i in range(1, 14)},
                **{f"C{i}": pa.string() for i in range(1, 27)}}


def _criteo_examples(rb):
    n = rb.num_rows
    labels = rb.column("label").to_numpy().astype(np.float32)
    dense = np.empty((n, 13), np.float32)
    for j in range(13):
        x = rb.column(f"I{j + 1}").fill_null(0).to_numpy()
        dense[:, j] = np.log1p(np.maximum(x, 0))
    values = np.empty((n, 26), np.uint64)
    for j in range(26):
        _hex_strings(*text_buffers(rb.column(f"C{j + 1}")), np.uint64(MISSING_VALUE), values, j)
    return labels, dense, values


LIBSVM_NAMES = ["label"] + [f"f{j}" for j in range(10)]
LIBSVM_TYPES = {"label": pa.int8(), **{f"f{j}": pa.string() for j in range(10)}}


def _libsvm_batch(rb):
    n = rb.num_rows
    labels = (rb.column("label").to_numpy() == 1).astype(np.float32)
    idx = np.empty((n, 10), np.uint64)
    val = np.empty((n, 10), np.float32)
    for j in range(10):
        parts = pc.split_pattern(rb.column(f"f{j}"), ":")
        idx[:, j] = pc.cast(pc.list_element(parts, 0), pa.uint64()).to_numpy()
        val[:, j] = pc.cast(pc.list_element(parts, 1), pa.float32()).to_numpy()
    field = np.tile(np.arange(10, dtype=np.int32), n)
    return Batch(labels, np.zeros((n, 0), np.float32), make_keys(field, idx.reshape(-1)), field, val.reshape(-1),
                 np.arange(0, 10 * n + 1, 10, dtype=np.int64), 10)


def peer_same_work(path, fmt) -> list:
    """pyarrow's streaming reader + the same column work -> Batches (not re-cut to BATCH rows: the
    rebatching copy is left to hps alone)."""
    out = []
    if fmt == "criteo":
        for rb in _stream(path, "\t", CRITEO_NAMES, CRITEO_TYPES):
            labels, dense, values = _criteo_examples(rb)
            n = len(labels)
            keys = make_keys(np.tile(np.arange(26), n), values.reshape(-1)).reshape(n, 26)
            out.append(FixedBatch(labels, dense, keys).batch())
    elif fmt == "libsvm":
        for rb in _stream(path, " ", LIBSVM_NAMES, LIBSVM_TYPES):
            out.append(_libsvm_batch(rb))
    elif fmt == "csv":
        plan = plan_columns(["click", *CSV_COLS], "click")
        for rb in _stream(path, ",", None, {"click": pa.int8(), **{c: pa.string() for c in CSV_COLS}}):
            labels, dense, values, code = arrow_examples(rb, plan)
            out.append(FixedBatch(labels, dense, values).batch())
    else:  # parquet: hps's reader is pyarrow + this column work already
        plan = plan_columns(["click", *CSV_COLS], "click")
        with pq.ParquetFile(path) as pf:
            for rb in pf.iter_batches(batch_size=65536):  # threads as hps's reader uses them
                labels, dense, values, code = arrow_examples(rb, plan)
                out.append(FixedBatch(labels, dense, values).batch())
    return out


def peer_decode_only(path, fmt) -> int:
    if fmt == "parquet":
        with pq.ParquetFile(path) as pf:
            return sum(rb.num_rows for rb in pf.iter_batches(batch_size=65536))
    names, types, delim = {"criteo": (CRITEO_NAMES, CRITEO_TYPES, "\t"), "libsvm": (LIBSVM_NAMES, LIBSVM_TYPES, " "),
                           "csv": (None, {"click": pa.int8(), **{c: pa.string() for c in CSV_COLS}}, ",")}[fmt]
    return sum(rb.num_rows for rb in _stream(path, delim, names, types))


def _best(fn, *args, reps=3):
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.parametrize("fmt, comp", CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_read(benchmark, record, files, fmt, comp):
    path = files[fmt, comp]
    mine, theirs = Batch.concat(hps_read(path, fmt)), Batch.concat(peer_same_work(path, fmt))  # warm up
    assert len(mine) == len(theirs) == ROWS
    np.testing.assert_array_equal(mine.keys, theirs.keys)  # the same work: the same keys
    np.testing.assert_array_equal(mine.labels, theirs.labels)
    benchmark.pedantic(hps_read, args=(path, fmt), rounds=3, iterations=1)
    hps_s = benchmark.stats.stats.min
    same_s = _best(peer_same_work, path, fmt)
    decode_s = _best(peer_decode_only, path, fmt)
    size = path.stat().st_size
    record(format=fmt, compression=comp, rows=ROWS, file_bytes=size,
           hps_rows_per_s=ROWS / hps_s, hps_bytes_per_s=size / hps_s,
           pyarrow_same_work_rows_per_s=ROWS / same_s, pyarrow_same_work_bytes_per_s=size / same_s,
           pyarrow_decode_only_rows_per_s=ROWS / decode_s, ratio_vs_same_work=same_s / hps_s,
           peer=f"pyarrow {pa.__version__} (CSV streaming reader, one thread)")


def summary_lines(figures: list) -> list:
    lines = ["readers: M rows/s (MB/s of the stored file)   hps | pyarrow same work | pyarrow decode only"]
    for f in figures:
        lines.append(f"  {f['format']:>8} {f['compression']:>5}: {f['hps_rows_per_s'] / 1e6:6.2f} "
                     f"({f['hps_bytes_per_s'] / 1e6:6.1f}) | {f['pyarrow_same_work_rows_per_s'] / 1e6:6.2f} "
                     f"({f['pyarrow_same_work_bytes_per_s'] / 1e6:6.1f}) | {f['pyarrow_decode_only_rows_per_s'] / 1e6:6.2f}"
                     f"   hps/pyarrow same work {f['ratio_vs_same_work']:.2f}x")
    return lines


@pytest.mark.parametrize("fmt", ["synthetic"])
def test_generate_synthetic(benchmark, fmt):
    def run():
        ds = open_dataset(None, "synthetic", BATCH, rows=ROWS)
        return sum(len(b) for b in ds.batches())
    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info.update(rows=ROWS, examples_per_sec=ROWS / benchmark.stats.stats.min)
