"""--dense-transform for CSV / Parquet dense columns: a column like an hour stamp (~1.4e7) saturates the
model raw (a warning says so); standardized it trains, with statistics of the training data that
the eval data, hps.predict (through the export) and hps.convert apply alike."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hps.config import Config
from hps.convert import convert
from hps.data import open_dataset
from hps.data._dense import SAMPLE_ROWS, apply, sample_stats
from hps.errors import InvalidInputError
from hps.metrics import auc
from hps.predict import Predictor
from hps.train import main
from hps.train._feed import Feed


def _rows(n, seed):
    rng = np.random.default_rng(seed)
    k = rng.integers(0, 24, n)  # the hour of the day inside a YYMMDDHH stamp: the only signal
    click = (rng.random(n) < np.where(k >= 12, 0.8, 0.2)).astype(int)
    return {"click": click, "hour": 14102100 + k, "site": [f"s{v}" for v in rng.integers(0, 5, n)]}


def _csv(path, n, seed):
    t = _rows(n, seed)
    path.write_text("click,hour,site\n" + "".join(f"{c},{h},{s}\n" for c, h, s in zip(t["click"], t["hour"], t["site"])))
    return path


def _run(tmp_path, name, fmt, train, ev, *extra):
    out, m = tmp_path / name, tmp_path / f"{name}.json"
    args = ["--format", fmt, "--data", str(train), "--eval-data", str(ev), "--dense-columns", "hour",
            "--batch-size", "1024", "--minibatch-size", "128", "--epochs", "3", "--no-progress",
            "--export", str(out), "--metrics-out", str(m), *extra]
    assert main(args) == 0
    return out, json.loads(m.read_text())


def test_a_raw_hour_stamp_is_warned_about_and_standardize_learns_it(tmp_path, capsys):
    train, ev = _csv(tmp_path / "t.csv", 8000, 0), _csv(tmp_path / "e.csv", 2000, 1)
    _, raw = _run(tmp_path, "raw", "csv", train, ev)
    out = capsys.readouterr().out
    assert "hps: warning: dense values of --data reach 1.41e+07" in out and "--dense-transform" in out
    model, std = _run(tmp_path, "std", "csv", train, ev, "--dense-transform", "standardize")
    assert "hps: warning" not in capsys.readouterr().out
    assert std["auc"] > 0.7 and std["auc"] > raw["auc"] + 0.1
    meta = json.loads((model / "model.json").read_text())["data"]["options"]
    assert meta["dense_transform"] == "standardize" and abs(meta["dense_stats"]["mean"][0] - 14102111.5) < 1.0
    probs, labels = Predictor(model).predict(ev)  # the export's statistics, not the eval file's own
    # (120 distinct inputs: float32 rounding reorders ties, so 1e-3, not 4 decimals; raw values give 0.5)
    assert abs(auc(labels, probs) - std["auc"]) < 1e-3


def test_eval_data_is_standardized_with_the_training_statistics(tmp_path):
    train, ev = _csv(tmp_path / "t.csv", 3000, 0), _csv(tmp_path / "e.csv", 500, 5)
    cfg = Config.from_flat(dict(format="csv", data=str(train), eval_data=str(ev), dense_columns=("hour",),
                                dense_transform="standardize", batch_size=512, minibatch_size=128))
    feed = Feed(cfg, 0, 1)
    stats = feed.readers[0].dense_stats
    assert feed._eval[0].dense_stats == stats == feed.format_options["dense_stats"]
    hours = np.array(_rows(3000, 0)["hour"], np.float64)
    np.testing.assert_allclose(stats["mean"], [hours.mean()])
    np.testing.assert_allclose(stats["std"], [hours.std()])
    b = next(iter(feed.eval_batches()))
    want = (np.array(_rows(500, 5)["hour"][:len(b)], np.float64) - stats["mean"][0]) / stats["std"][0]
    np.testing.assert_array_equal(b.dense[:, 0], want.astype(np.float32))


def test_the_statistics_come_from_the_first_rows_of_the_whole_data_on_every_shard(tmp_path):
    train = _csv(tmp_path / "t.csv", 3000, 0)
    a = open_dataset(train, "csv", 100, shard=(1, 2), dense_columns=["hour"], dense_transform="standardize")
    b = open_dataset(train, "csv", 100, shard=(0, 2), dense_columns=["hour"], dense_transform="standardize")
    assert a.dense_stats == b.dense_stats


def test_log1p_is_criteos_for_counts_and_symmetric_below_zero():
    x = np.array([[0.0, 1.0, 1e7, -3.0]], np.float32)
    np.testing.assert_allclose(apply(x, "log1p", None), [[0.0, np.log1p(1.0), np.log1p(1e7), -np.log1p(3.0)]],
                               rtol=1e-6)
    assert apply(x, "none", None) is x


def test_sample_stats_read_only_the_first_rows_and_a_constant_column_is_centred():
    class B:
        def __init__(self, d):
            self.dense = d

    parts = iter([B(np.ones((SAMPLE_ROWS, 2), np.float32)), B(np.full((5, 2), 99, np.float32))])
    st = sample_stats(parts)
    assert st == {"mean": [1.0, 1.0], "std": [1.0, 1.0]}
    assert next(parts).dense[0, 0] == 99  # the second part was never read


@pytest.mark.parametrize("flat, msg", [
    (dict(format="criteo", data="x.txt", dense_transform="log1p"), "option of --format csv and parquet"),
    (dict(format="csv", data="x.csv", dense_transform="sqrt"), "dense-transform must be one of"),
])
def test_bad_transform_options(flat, msg):
    with pytest.raises(InvalidInputError, match=msg):
        Config.from_flat(flat)


def test_parquet_and_its_conversion_apply_the_same_transform(tmp_path):
    t = _rows(4000, 2)
    pq.write_table(pa.table(t), tmp_path / "t.parquet")
    src = list(open_dataset(tmp_path / "t.parquet", "parquet", 500, dense_columns=["hour"],
                            dense_transform="standardize").batches())
    assert abs(np.concatenate([b.dense for b in src]).mean()) < 1e-3
    convert("parquet", tmp_path / "t.parquet", tmp_path / "conv", {"dense_columns": ["hour"],
                                                                    "dense_transform": "standardize"})
    conv = list(open_dataset(tmp_path / "conv", "parquet", 500, dense_transform="standardize").batches())
    for a, b in zip(src, conv):
        np.testing.assert_array_equal(a.dense, b.dense)
    with pytest.raises(InvalidInputError, match="converted with --dense-transform standardize"):
        open_dataset(tmp_path / "conv", "parquet", 500, dense_transform="log1p")
