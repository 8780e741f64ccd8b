"""The data format of a job comes from ``--format``, else from the file names of ``--data`` /
``--eval-data`` (Criteo's ``.txt`` by its first line), else it is an error saying to pass ``--format``:
``--data train.csv`` used to train the synthetic default silently. An option of another format
(``--rows`` with a file, ``--label-column`` with synthetic data) is an error naming it."""

import dataclasses
import gzip
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from hps.config import DataConfig
from hps.data import infer_format
from hps.errors import InvalidInputError
from hps.cli import parse_config
from hps.train import main
from tests.test_train_mpi import criteo_file

SMALL = ["--batch-size", "512", "--minibatch-size", "128", "--embedding-dim", "4", "--hidden", "8", "--no-progress"]
LIBSVM = "".join(f"{i % 2} {i % 7}:1 {10 + i % 5}:0.5\n" for i in range(400))


def _csv(path, n=600, seed=0):
    rng = np.random.default_rng(seed)
    rows = "".join(f"{c},s{s},{p:.2f}\n" for c, s, p in zip(rng.integers(0, 2, n), rng.integers(0, 9, n), rng.random(n)))
    path.write_text("click,site,price\n" + rows)
    return path


@pytest.fixture
def files(tmp_path):
    d = tmp_path
    _csv(d / "a.csv")
    (d / "a.csv.gz").write_bytes(gzip.compress((d / "a.csv").read_bytes()))
    pq.write_table(pa.table({"click": [0, 1], "site": ["x", "y"]}), d / "a.parquet")
    (d / "a.libfm").write_text(LIBSVM)
    (d / "a.libsvm.zst").write_bytes(zstandard.ZstdCompressor().compress(LIBSVM.encode()))
    criteo_file(d / "train.txt", n=300)
    (d / "frappe.txt").write_text(LIBSVM)
    (d / "notes.txt").write_text("label,a,b\n1,x,y\n")
    (d / "train.gz").write_bytes(gzip.compress((d / "a.csv").read_bytes()))  # Avazu's train.gz: CSV inside
    return d


@pytest.mark.parametrize("name, fmt", [("a.csv", "csv"), ("a.csv.gz", "csv"), ("a.parquet", "parquet"),
                                       ("a.libfm", "libsvm"), ("a.libsvm.zst", "libsvm"), ("train.txt", "criteo"),
                                       ("frappe.txt", "libsvm")])
def test_the_format_of_a_file_from_its_name_or_first_line(files, name, fmt):
    assert infer_format(str(files / name)) == fmt


@pytest.mark.parametrize("name, why", [("notes.txt", "cannot tell the data format of"),
                                       ("train.gz", "cannot tell the data format of")])
def test_a_name_that_does_not_tell_is_an_error_saying_to_pass_format(files, name, why):
    with pytest.raises(InvalidInputError, match=why) as e:
        infer_format(str(files / name))
    assert "pass --format" in str(e.value) and name in str(e.value)
    assert infer_format(str(files / name), required=False) is None


def test_directories_globs_and_disagreeing_files(files, tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    for i in range(3):
        _csv(parts / f"part-{i}.csv", 50, i)
    assert infer_format(str(parts)) == "csv" and infer_format(str(parts / "part-*.csv")) == "csv"
    assert infer_format([str(files / "a.csv"), str(files / "a.csv.gz")]) == "csv"
    with pytest.raises(InvalidInputError, match="different formats .*a.csv reads as csv, .*a.libfm as libsvm"):
        infer_format(str(files / "a.csv"), str(files / "a.libfm"))


def test_data_without_format_is_read_as_its_files_format(files):
    """It was the synthetic default: 200,000 generated rows instead of the file."""
    d = parse_config(["--data", str(files / "a.csv"), "--eval-data", str(files / "a.csv.gz")]).data
    assert (d.format, d.rows, d.label_column) == ("csv", None, "click")
    assert parse_config(["--data", str(files / "train.txt")]).data.format == "criteo"
    assert parse_config([]).data.format == "synthetic" and parse_config([]).data.rows == 200_000
    with pytest.raises(InvalidInputError, match="pass --format"):
        parse_config(["--data", str(files / "train.gz")])
    assert parse_config(["--format", "csv", "--data", str(files / "train.gz")]).data.format == "csv"
    d = parse_config(["--data", str(files / "a.csv")]).data
    assert dataclasses.replace(d, eval_data=None).format == "csv"  # the warm-up's copy of the options


@pytest.mark.parametrize("args, message", [
    (["--data", "{d}/a.csv", "--rows", "5000"],
     "--rows is an option of --format synthetic, not of --format csv (inferred from the --data file names)"),
    (["--format", "libsvm", "--data", "{d}/a.libfm", "--zipf", "1.2"], "--zipf is an option of --format synthetic"),
    (["--data", "{d}/train.txt", "--drift", "0"], "--drift is an option of --format synthetic, not of --format criteo"),
    (["--data", "{d}/a.parquet", "--vocab-per-field", "9"], "--vocab-per-field is an option of --format synthetic"),
    (["--label-column", "y"], "--label-column is an option of --format csv and parquet, not of --format synthetic "
                              "(no --data given)"),
    (["--eval-data", "{d}/a.csv"], "--eval-data is an option of data files (--format criteo, libsvm, csv, parquet)"),
    (["--format", "synthetic", "--data", "{d}/a.csv"], "--data is an option of data files"),
    (["--strict"], "--strict is an option of data files"),
    (["--max-malformed", "0.2"], "--max-malformed is an option of data files"),
    (["--data", "{d}/a.csv", "--libsvm-fields", "3"], "--libsvm-fields is an option of --format libsvm, not of --format csv"),
])
def test_an_option_of_another_format_is_an_error_naming_it(files, args, message):
    with pytest.raises(InvalidInputError) as e:
        parse_config([a.format(d=files) for a in args])
    assert message in str(e.value)


def test_train_and_profile_on_a_file_without_format(files, tmp_path, capsys):
    m = tmp_path / "m.json"
    assert main(["--data", str(files / "a.csv"), "--eval-data", str(files / "a.csv"), "--dense-columns", "price",
                 "--metrics-out", str(m), *SMALL]) == 0
    out = capsys.readouterr().out
    assert "hps: training csv data" in out and '"examples": 600' in m.read_text()
    assert main(["--data", str(files / "a.csv"), "--rows", "9", *SMALL]) == 2
    assert capsys.readouterr().err == ("hps: error: --rows is an option of --format synthetic, not of --format csv "
                                       "(inferred from the --data file names)\n")
    proc = subprocess.run([sys.executable, "-m", "hps.profile", "--data", str(files / "a.libfm"), "--hot-bytes", "4k",
                           "--out", str(tmp_path / "p.h5")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "profile written" in proc.stdout, proc.stderr


def test_predict_refuses_data_named_as_another_format(files, tmp_path, capsys):
    from hps.predict._main import predict_main

    export = tmp_path / "model"
    assert main(["--data", str(files / "a.csv"), "--export", str(export), *SMALL]) == 0
    capsys.readouterr()
    assert predict_main(["--model-dir", str(export), "--data", str(files / "a.parquet"), "--out",
                         str(tmp_path / "p.csv")]) == 2
    assert "--data is parquet data by its file names, but the model in" in capsys.readouterr().err
    assert predict_main(["--model-dir", str(export), "--data", str(files / "a.csv.gz"), "--out",
                         str(tmp_path / "p.csv")]) == 0


def test_the_data_config_library_default_is_synthetic():
    d = DataConfig()
    assert (d.format, d.rows, d.fields, d.max_malformed, d.label_column) == ("synthetic", 200_000, 8, None, None)
