"""The trainer on practitioners' inputs: a directory / glob / list of plain, .gz and .zst files, the
column flags, Criteo's --int-as-categorical; and what a run records (config, version, files, name)."""

import gzip
import json

import numpy as np
import pytest
import zstandard

import hps
from hps import InvalidInputError
from hps.train import main
from hps.cli import parse_config

from .test_train_mpi import compare, criteo_file, mpirun

SMALL = ["--batch-size", "512", "--minibatch-size", "128", "--embedding-dim", "8", "--hidden", "8",
         "--no-progress"]


def _csv_parts(d, n_parts=3, rows=600):
    """An Avazu-like CSV cut into parts: plain, .gz, .zst (with a unique row id column)."""
    rng = np.random.default_rng(0)
    d.mkdir()
    header = "id,click,site,app,price\n"
    sufs = [".csv", ".csv.gz", ".csv.zst"]
    for p in range(n_parts):
        body = "".join(f"{p * rows + i},{rng.integers(0, 2)},s{rng.integers(0, 30)},a{rng.integers(0, 9)},"
                       f"{rng.random():.3f}\n" for i in range(rows))
        data = (header + body).encode()
        suf = sufs[p % 3]
        path = d / f"part-{p}{suf}"
        path.write_bytes(gzip.compress(data) if suf.endswith(".gz") else
                         zstandard.ZstdCompressor().compress(data) if suf.endswith(".zst") else data)
    return d


def test_directory_of_compressed_csv_with_columns_and_records(tmp_path):
    d = _csv_parts(tmp_path / "parts")
    m_out = tmp_path / "m.json"
    assert main(["--format", "csv", "--data", str(d), "--eval-data", str(d / "part-1.csv.gz"),
                 "--ignore-columns", "id", "--dense-columns", "price", "--metrics-out", str(m_out),
                 "--export", str(tmp_path / "model"), *SMALL]) == 0
    m = json.loads(m_out.read_text())
    assert m["examples"] == 1800 and m["eval_examples"] == 600
    assert m["data_files"] == [str(d / f) for f in ("part-0.csv", "part-1.csv.gz", "part-2.csv.zst")]
    assert m["eval_data_files"] == [str(d / "part-1.csv.gz")]
    assert m["hps_version"] == hps.__version__
    c = m["config"]
    assert c["data"]["ignore_columns"] == ["id"] and c["data"]["dense_columns"] == ["price"]
    assert c["model"]["embedding_dim"] == 8 and c["train"]["batch_size"] == 512  # defaults resolved too:
    assert c["tiers"]["rows_per_file"] == 16384 and c["model"]["sparse_optimizer"] == "adagrad"
    assert m["run_name"].startswith("ctr on csv part-0.csv +2 files, ")
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert meta["data"]["options"]["categorical_columns"] == ["site", "app"]  # id dropped, price dense
    assert (meta["data"]["n_fields"], meta["data"]["n_dense"]) == (2, 1)


def test_several_data_paths_and_globs(tmp_path):
    d = _csv_parts(tmp_path / "parts")
    cfg = parse_config(["--format", "csv", "--data", str(d / "part-0.csv"), str(d / "part-[12]*")])
    assert cfg.data.data == (str(d / "part-0.csv"), str(d / "part-[12]*"))
    m_out = tmp_path / "m.json"
    assert main(["--format", "csv", "--data", str(d / "part-0.csv"), str(d / "part-[12]*"), "--ignore-columns",
                 "id", "--metrics-out", str(m_out), *SMALL]) == 0
    assert json.loads(m_out.read_text())["examples"] == 1800


def test_int_as_categorical_and_toml_lists(tmp_path):
    data = criteo_file(tmp_path / "t.txt", n=1500)
    assert main(["--format", "criteo", "--data", str(data), "--int-as-categorical", "--export",
                 str(tmp_path / "model"), *SMALL]) == 0
    meta = json.loads((tmp_path / "model" / "model.json").read_text())
    assert meta["data"]["n_fields"] == 39 and meta["data"]["options"] == {"int_as_categorical": True}
    toml = tmp_path / "job.toml"
    toml.write_text('[data]\nformat = "parquet"\ndata = ["a.parquet", "b.parquet"]\n'
                    'ignore-columns = ["id"]\ncategorical-columns = "site, app"\n')
    d = parse_config(["--config", str(toml)]).data
    assert (d.data, d.ignore_columns, d.categorical_columns) == (("a.parquet", "b.parquet"), ("id",), ("site", "app"))


@pytest.mark.parametrize("args, message", [
    (["--format", "criteo", "--data", "x", "--ignore-columns", "id"], "--ignore-columns is an option of --format csv"),
    (["--format", "libsvm", "--data", "x", "--dense-columns", "a"], "--dense-columns is an option of --format csv"),
    (["--format", "csv", "--data", "x", "--int-as-categorical"], "--int-as-categorical is an option of --format criteo"),
])
def test_format_options_of_another_format(args, message):
    with pytest.raises(InvalidInputError, match=message):
        parse_config(args)


def test_bad_inputs_are_one_line_and_exit_2(tmp_path, capsys):
    d = _csv_parts(tmp_path / "parts")
    assert main(["--format", "csv", "--data", str(tmp_path / "nothing-*.csv.gz"), *SMALL]) == 2
    assert "no data file matches" in capsys.readouterr().err
    assert main(["--format", "csv", "--data", str(d), "--ignore-columns", "idx", *SMALL]) == 2
    assert "ignore column(s) ['idx'] not in the columns of the CSV header" in capsys.readouterr().err


def test_plots_carry_the_run_name(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from hps.train import _plots

    plt = _plots.require()
    titles = []
    real = plt.Figure.suptitle
    monkeypatch.setattr(plt.Figure, "suptitle", lambda self, t, **k: titles.append(t) or real(self, t, **k))
    m = {"stage_seconds": {"read": 1.0}, "loss_per_batch": [0.5], "cache_hit_rate_per_batch": [1.0],
         "run_name": "ctr on csv x.csv, 2026-11-22 18:00 UTC"}
    paths = _plots.draw(m, tmp_path)
    assert titles == [m["run_name"]] * len(paths) and paths


@pytest.mark.mpi
def test_ranks_on_compressed_parts_train_like_one_process(mpiexec, tmp_path):
    """Plain, .gz and .zst parts of a Criteo file: 2 ranks end with the model of 1 process with
    --data-shards 2 (compressed files go whole to one shard, plain ones are cut)."""
    src = criteo_file(tmp_path / "all.txt", n=6000).read_bytes().splitlines(keepends=True)
    d = tmp_path / "parts"
    d.mkdir()
    (d / "a.txt").write_bytes(b"".join(src[:3000]))
    (d / "b.txt.gz").write_bytes(gzip.compress(b"".join(src[3000:4500])))
    (d / "c.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(b"".join(src[4500:])))
    args = ["--format", "criteo", "--data", str(d), "--eval-data", str(d / "b.txt.gz"), "--batch-size", "1024",
            "--minibatch-size", "256", "--hidden", "16,8", "--embedding-dim", "8", "--no-progress"]
    assert main([*args, "--data-shards", "2", "--export", str(tmp_path / "one"),
                 "--metrics-out", str(tmp_path / "one.json")]) == 0
    proc = mpirun(mpiexec, 2, [*args, "--export", str(tmp_path / "two"), "--metrics-out", str(tmp_path / "two.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    compare(hps.load_export(tmp_path / "one", first_order=True), hps.load_export(tmp_path / "two", first_order=True),
            1e-5)
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert one["examples"] == two["examples"] == 6000 and round(one["auc"], 4) == round(two["auc"], 4)
