"""CSV / Parquet eval data is matched to the training data's columns by name, as the training files are:
another column order, or extra columns, evaluate the same model to the same AUC."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hps.train import main

COLS = ["click", "site", "app", "device", "hour"]


def _table(n, seed):
    rng = np.random.default_rng(seed)
    site, app, device = rng.integers(0, 30, n), rng.integers(0, 20, n), rng.integers(0, 5, n)
    logit = 0.15 * site - 0.2 * app + 0.4 * device - 2.5
    click = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(int)
    return {"click": click, "site": [f"s{v}" for v in site], "app": [f"a{v}" for v in app],
            "device": [f"d{v}" for v in device], "hour": rng.integers(0, 24, n)}


def _write(path, t, cols):
    if path.suffix == ".parquet":
        pq.write_table(pa.table({c: t[c] for c in cols}), path)
    else:
        path.write_text(",".join(cols) + "\n" + "".join(",".join(str(t[c][i]) for c in cols) + "\n"
                                                        for i in range(len(t["click"]))))
    return path


def _auc(tmp_path, fmt, train, ev, name):
    metrics = tmp_path / f"{name}.json"
    args = ["--format", fmt, "--data", str(train), "--eval-data", str(ev), "--dense-columns", "hour",
            "--batch-size", "1024", "--minibatch-size", "128", "--epochs", "2", "--no-progress",
            "--metrics-out", str(metrics)]
    assert main(args) == 0
    return json.loads(metrics.read_text())["auc"]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_eval_columns_are_matched_by_name(tmp_path, fmt):
    ext = "." + fmt
    train = _write(tmp_path / f"t{ext}", _table(6000, 0), COLS)
    ev = _table(1500, 1)
    same = _auc(tmp_path, fmt, train, _write(tmp_path / f"e{ext}", ev, COLS), "same")
    assert same > 0.65  # the model learned something the column order could spoil
    shuffled = ["hour", "device", "click", "app", "site"]
    assert _auc(tmp_path, fmt, train, _write(tmp_path / f"e2{ext}", ev, shuffled), "shuffled") == same
    ev["extra"] = ["z"] * 1500
    assert _auc(tmp_path, fmt, train, _write(tmp_path / f"e3{ext}", ev, ["extra", *shuffled]), "extra") == same


def test_an_eval_file_without_a_training_column_is_an_error_naming_it(tmp_path, capsys):
    train = _write(tmp_path / "t.csv", _table(3000, 0), COLS)
    ev = _write(tmp_path / "e.csv", _table(300, 1), ["click", "site", "device", "hour"])
    assert main(["--format", "csv", "--data", str(train), "--eval-data", str(ev), "--dense-columns", "hour",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--eval-data" in err and "['app']" in err


def test_fae_held_out_examples_take_the_eval_columns_by_name(tmp_path):
    """FAE's Shuffle Scheduler scores held-out eval examples: they too are read by column name."""
    from types import SimpleNamespace

    from hps.config import Config
    from hps.train._fae import FaeFeature, FaeOptions
    from hps.train._feed import Feed

    train = _write(tmp_path / "t.csv", _table(3000, 0), COLS)
    ev = _table(500, 1)
    held = []
    for name, cols in (("e.csv", COLS), ("e2.csv", ["hour", "device", "click", "app", "site"])):
        cfg = Config.from_flat(dict(format="csv", data=str(train), eval_data=str(_write(tmp_path / name, ev, cols)),
                                    dense_columns=("hour",), batch_size=1024, minibatch_size=128))
        feed, tc = Feed(cfg, 0, 1), cfg.train
        opts = FaeOptions("auto", None, 1.0, 300, tc.minibatch_size, tc.seed, tc.batch_size)
        fae = FaeFeature(None, opts, cfg.data, SimpleNamespace(rank=0, size=1), 9, feed.n_fields, feed.n_dense,
                         feed.has_eval, feed.eval_options, predict=None, log=print)
        held.append(fae._holdout(300))
    np.testing.assert_array_equal(held[0].keys, held[1].keys)
    np.testing.assert_array_equal(held[0].dense, held[1].dense)
