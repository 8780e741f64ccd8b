"""Ranks that read different copies of the input stop at start, on every rank, naming the rank and
the file (byte-range shards cut from different file sizes would skip or repeat lines silently).
Each rank gets its own copy through mpiexec's MPMD form (``cmd A : cmd B``); paths may differ."""

import shutil
import subprocess
import sys

import numpy as np
import pytest

from hps.train import load_export
from hps.train._inputs import EDGE_BYTES, describe
from tests.test_predict import _rows, _write_csv
from tests.test_train_mpi import compare

pytestmark = pytest.mark.mpi

FLAGS = ["--format", "csv", "--ignore-columns", "id", "--dense-columns", "price,hour", "--batch-size", "512",
         "--minibatch-size", "128", "--embedding-dim", "8", "--hidden", "16", "--no-progress"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("copies")
    rng = np.random.default_rng(0)
    _write_csv(d / "train.csv", _rows(rng, 4000))
    _write_csv(d / "eval.csv", _rows(rng, 1000))
    return d


def _per_rank(mpiexec, args0, args1, timeout=300):
    """mpiexec with rank 0 running ``hps.train args0`` and rank 1 ``hps.train args1``."""
    cmd = [mpiexec, "-n", "1", sys.executable, "-m", "hps.train", *args0,
           ":", "-n", "1", sys.executable, "-m", "hps.train", *args1]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def _job(d, train, evals, *extra):
    return [*FLAGS, "--data", str(train), "--eval-data", str(evals), *extra]


def test_a_rank_with_a_shorter_copy_stops_every_rank(mpiexec, data, tmp_path):
    part = tmp_path / "partial.csv"
    lines = (data / "train.csv").read_text().splitlines(keepends=True)
    part.write_text("".join(lines[:3000]))  # a partial copy: the first 3,000 lines
    proc = _per_rank(mpiexec, _job(data, data / "train.csv", data / "eval.csv"),
                     _job(data, part, data / "eval.csv"))
    assert proc.returncode != 0, proc.stdout[-2000:]
    size0, size1 = (data / "train.csv").stat().st_size, part.stat().st_size
    want = (f"the ranks read different --data: file 1 of 1, {part} on rank 1 ({data / 'train.csv'} on rank 0) "
            f"has {size1:,} bytes on rank 1, {size0:,} on rank 0; give every rank the same files")
    assert want in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_the_same_size_with_other_bytes_is_caught_and_eval_data_too(mpiexec, data, tmp_path):
    other = tmp_path / "eval.csv"
    text = bytearray((data / "eval.csv").read_bytes())
    text[-3] = ord("9") if text[-3] != ord("9") else ord("8")  # the last line's last value
    other.write_bytes(bytes(text))
    proc = _per_rank(mpiexec, _job(data, data / "train.csv", data / "eval.csv"),
                     _job(data, data / "train.csv", other))
    assert proc.returncode != 0
    assert (f"the ranks read different --eval-data: file 1 of 1, {other} on rank 1 ({data / 'eval.csv'} on rank 0) "
            "holds other bytes at its start or end on rank 1 than on rank 0") in proc.stderr, proc.stderr[-3000:]


def test_a_missing_file_on_one_rank_stops_every_rank_naming_it(mpiexec, data, tmp_path):
    proc = _per_rank(mpiexec, _job(data, data / "train.csv", data / "eval.csv"),
                     _job(data, tmp_path / "nope.csv", data / "eval.csv"))
    assert proc.returncode != 0  # rank 1 says what it cannot read, rank 0 that rank 1 cannot
    assert f"hps: rank 1 of 2 failed: DataFileNotFoundError: data file not found: {tmp_path / 'nope.csv'}" in \
        proc.stderr, proc.stderr[-3000:]


def test_identical_copies_at_other_paths_train_like_one_copy(mpiexec, data, tmp_path):
    copy = tmp_path / "node2"
    shutil.copytree(data, copy)
    one = _per_rank(mpiexec, _job(data, data / "train.csv", data / "eval.csv", "--export", str(tmp_path / "a")),
                    _job(data, data / "train.csv", data / "eval.csv", "--export", str(tmp_path / "a")))
    two = _per_rank(mpiexec, _job(data, data / "train.csv", data / "eval.csv", "--export", str(tmp_path / "b")),
                    _job(copy, copy / "train.csv", copy / "eval.csv", "--export", str(tmp_path / "b")))
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-3000:]
    compare(load_export(tmp_path / "a", first_order=True), load_export(tmp_path / "b", first_order=True), 0.0)


def test_describe_reads_both_ends(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    body = bytes(range(256)) * (3 * EDGE_BYTES // 256)
    a.write_bytes(body)
    b.write_bytes(body[:EDGE_BYTES + 10] + b"X" + body[EDGE_BYTES + 11:])  # the middle: not read
    assert describe([a])[0][1:] == describe([b])[0][1:]
    b.write_bytes(body[:-1] + b"X")
    assert describe([a])[0][2] != describe([b])[0][2]
