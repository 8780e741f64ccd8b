"""Reader throughput (examples/s) of each data format, beside pyarrow.csv.read_csv of the same file.

Run: ``pytest bench/bench_readers.py --benchmark-only``. Files are generated in a temp folder
(Criteo-like TSV, Frappe-like libsvm, Avazu-like CSV). The peer (pyarrow's C++ CSV reader,
single-threaded like hps) only splits and types the columns; hps also hashes every feature into a
key and builds the CSR ``Batch``es. ``extra_info`` holds examples/s of both and their ratio.
"""

from __future__ import annotations

import os
import platform
import time

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from hps.data import open_dataset

ROWS = int(os.environ.get("HPS_BENCH_READER_ROWS", 200_000))
BATCH = 4096


def _criteo(path, rng, n):
    ints = rng.integers(0, 1000, (n, 13)).astype(str)
    ints[rng.random((n, 13)) < 0.2] = ""
    cats = np.char.mod("%08x", rng.integers(0, 2**32, (n, 26)))
    cats[rng.random((n, 26)) < 0.1] = ""
    lab = rng.integers(0, 2, (n, 1)).astype(str)
    rows = np.concatenate([lab, ints, cats.astype(str)], axis=1)
    path.write_text("\n".join("\t".join(r) for r in rows) + "\n")


def _libsvm(path, rng, n):
    idx = rng.integers(0, 5000, (n, 10)) + np.arange(10) * 5000
    lab = np.where(rng.random(n) < 0.33, "1", "-1")
    path.write_text("".join(f"{l} " + " ".join(f"{i}:1" for i in r) + "\r\n"
                            for l, r in zip(lab, idx)))


def _csv(path, rng, n):
    cols = [f"c{i}" for i in range(21)]
    vals = np.char.mod("%x", rng.integers(0, 10_000, (n, 21)))
    lab = rng.integers(0, 2, (n, 1)).astype(str)
    rows = np.concatenate([lab, vals.astype(str)], axis=1)
    path.write_text("click," + ",".join(cols) + "\n" + "\n".join(",".join(r) for r in rows) + "\n")


FORMATS = {
    "criteo": (_criteo, dict(delimiter="\t"), dict(autogenerate_column_names=True)),
    "libsvm": (_libsvm, dict(delimiter=" "), dict(autogenerate_column_names=True)),
    "csv": (_csv, dict(delimiter=","), dict()),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("readers")
    rng = np.random.default_rng(0)
    out = {}
    for fmt, (make, _, _) in FORMATS.items():
        out[fmt] = d / f"data.{fmt}"
        make(out[fmt], rng, ROWS)
    return out


def _hps_read(path, fmt):
    ds = open_dataset(path, fmt, BATCH)
    n = sum(len(b) for b in ds.batches())
    assert n == ROWS and ds.stats.malformed == 0
    return n


def _peer_read(path, fmt):
    _, parse, read = FORMATS[fmt]
    t = pacsv.read_csv(path, read_options=pacsv.ReadOptions(use_threads=False, **read),
                       parse_options=pacsv.ParseOptions(**parse))
    assert t.num_rows == ROWS
    return t.num_rows


def _best(fn, *args, reps=3):
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    return best


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_read_hps(benchmark, files, fmt):
    _hps_read(files[fmt], fmt)  # warm up (Numba compile / page cache)
    benchmark.pedantic(_hps_read, args=(files[fmt], fmt), rounds=3, iterations=1)
    hps_s = benchmark.stats.stats.min
    peer_s = _best(_peer_read, files[fmt], fmt)
    benchmark.extra_info.update(
        rows=ROWS, bytes=files[fmt].stat().st_size, examples_per_sec=ROWS / hps_s,
        peer="pyarrow.csv.read_csv %s (use_threads=False)" % pa.__version__,
        peer_examples_per_sec=ROWS / peer_s, ratio_vs_peer=peer_s / hps_s,
        cpu=platform.processor() or platform.machine(), cores=os.cpu_count())


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_read_peer_pyarrow(benchmark, files, fmt):
    benchmark.pedantic(_peer_read, args=(files[fmt], fmt), rounds=3, iterations=1)
    benchmark.extra_info.update(rows=ROWS, examples_per_sec=ROWS / benchmark.stats.stats.min)


@pytest.mark.parametrize("fmt", ["synthetic"])
def test_generate_synthetic(benchmark, fmt):
    def run():
        ds = open_dataset(None, "synthetic", BATCH, rows=ROWS)
        return sum(len(b) for b in ds.batches())
    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info.update(rows=ROWS, examples_per_sec=ROWS / benchmark.stats.stats.min)
