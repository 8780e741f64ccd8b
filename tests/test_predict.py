"""Scoring: ``hps.Predictor`` and ``python -m hps.predict`` reproduce the training job's eval AUC for
every model; the export records what they need; unknown keys get the documented default."""

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import hps
from hps import InvalidInputError
from hps.data import make_keys
from hps.data._parse_kernels import _fnv1a
from hps.metrics import auc
from hps.train import run
from hps.cli import parse_config
from hps.predict._main import predict_main

COMMON = ["--batch-size", "512", "--minibatch-size", "128", "--embedding-dim", "8", "--hidden", "16",
          "--no-progress", "--epochs", "2"]


def _rows(rng, n, sites=40):
    """An Avazu-like table with a learnable click: a row id, 3 categoricals, 2 dense columns."""
    site = rng.integers(0, sites, n)
    app = rng.integers(0, 25, n)
    dev = rng.integers(0, 8, n)
    price = rng.random(n) * 4
    hour = rng.integers(0, 24, n)
    z = np.sin(site) + np.cos(app * 1.7) + 0.5 * (dev % 3) + 0.4 * price - 1.0
    click = (rng.random(n) < 1 / (1 + np.exp(-2 * z))).astype(int)
    return {"id": np.arange(n), "click": click, "site": [f"s{x}" for x in site], "app": [f"a{x}" for x in app],
            "device": dev, "price": price, "hour": hour}


def _write_csv(path, t):
    cols = list(t)
    with open(path, "w") as f:
        f.write(",".join(cols) + "\n")
        for i in range(len(t["id"])):
            f.write(",".join(str(t[c][i]) for c in cols) + "\n")


@pytest.fixture(scope="module")
def csv_data(tmp_path_factory):
    d = tmp_path_factory.mktemp("csv")
    rng = np.random.default_rng(0)
    _write_csv(d / "train.csv", _rows(rng, 4000))
    _write_csv(d / "eval.csv", _rows(rng, 1500, sites=50))  # sites 40..49 never seen: unknown keys
    return d


def _train(d, model, fmt="csv", extra=()):
    ext = "csv" if fmt == "csv" else "parquet"
    cfg = parse_config(["--format", fmt, "--data", str(d / f"train.{ext}"), "--eval-data", str(d / f"eval.{ext}"),
                        "--ignore-columns", "id", "--dense-columns", "price,hour", "--model", model,
                        "--export", str(d / f"export-{model}-{fmt}"), *COMMON, *extra])
    return run(cfg, log=lambda *a, **k: None), d / f"export-{model}-{fmt}"


@pytest.mark.parametrize("model", ["ctr", "wdl", "deepfm", "dcn", "dlrm"])
def test_predictor_reproduces_the_training_auc(csv_data, model):
    metrics, export = _train(csv_data, model)
    p = hps.Predictor(export)
    probs, labels = p.predict(csv_data / "eval.csv")
    assert labels.shape[0] == metrics["eval_examples"] == 1500
    assert round(auc(labels, probs), 4) == round(metrics["auc"], 4)
    assert metrics["auc"] > 0.6  # it learned something: the AUC is not a coin flip matched by chance
    meta = json.loads((export / "model.json").read_text())
    assert meta["model_config"]["model"] == model
    assert meta["data"]["options"]["categorical_columns"] == ["site", "app", "device"]
    assert meta["data"]["options"]["dense_columns"] == ["price", "hour"]


def test_unknown_keys_default(csv_data):
    _, export = _train(csv_data, "wdl")
    p = hps.Predictor(export)
    field_site = 0
    seen = make_keys(np.array([field_site]), np.array([_fnv1a(np.frombuffer(b"s3", np.uint8), 0, 2)], np.uint64))
    never = make_keys(np.array([field_site]), np.array([_fnv1a(np.frombuffer(b"zz", np.uint8), 0, 2)], np.uint64))
    keys = np.concatenate([seen, never])
    rows, found = p.rows(keys)
    assert found.tolist() == [True, False]
    init = hps.mem.RowInitializer(p.row_params, p.row_params, 0, 0.01)(never)
    np.testing.assert_array_equal(rows[1], init[0])  # the row training would have made
    assert 0 < np.abs(rows[1]).max() <= 0.01
    rows0, _ = hps.Predictor(export, unknown="zero").rows(keys)
    np.testing.assert_array_equal(rows0[1], 0)
    np.testing.assert_array_equal(rows0[0], rows[0])


def test_predict_cli_writes_probabilities(csv_data, tmp_path, capsys):
    metrics, export = _train(csv_data, "deepfm")
    out = tmp_path / "preds.csv"
    assert predict_main(["--model-dir", str(export), "--data", str(csv_data / "eval.csv"), "--out", str(out)]) == 0
    assert f"AUC {metrics['auc']:.4f}" in capsys.readouterr().out
    got = np.loadtxt(out, delimiter=",", skiprows=1)
    assert out.read_text().startswith("label,probability\n") and got.shape == (1500, 2)
    assert round(auc(got[:, 0], got[:, 1]), 4) == round(metrics["auc"], 4)
    # data without the label column: probabilities only, the same ones
    lines = (csv_data / "eval.csv").read_text().splitlines()
    unl = tmp_path / "unlabelled.csv"
    unl.write_text("\n".join(",".join(c for j, c in enumerate(l.split(",")) if j != 1) for l in lines) + "\n")
    out2 = tmp_path / "preds2.csv"
    assert predict_main(["--model-dir", str(export), "--data", str(unl), "--out", str(out2)]) == 0
    assert out2.read_text().startswith("probability\n")
    np.testing.assert_allclose(np.loadtxt(out2, skiprows=1), got[:, 1], rtol=1e-6)


def test_predict_cli_errors(tmp_path, capsys):
    assert predict_main(["--model-dir", str(tmp_path), "--data", "x.csv", "--out", str(tmp_path / "o.csv")]) == 2
    assert "has no model.json" in capsys.readouterr().err


def test_parquet_training_and_scoring(tmp_path):
    rng = np.random.default_rng(1)
    for name, n in (("train", 4000), ("eval", 1500)):
        pq.write_table(pa.table(_rows(rng, n)), tmp_path / f"{name}.parquet", row_group_size=700)
    metrics, export = _train(tmp_path, "dcn", fmt="parquet")
    probs, labels = hps.Predictor(export).predict(tmp_path / "eval.parquet")
    assert round(auc(labels, probs), 4) == round(metrics["auc"], 4) and metrics["auc"] > 0.6


def test_predict_via_module(csv_data, tmp_path):
    _, export = _train(csv_data, "ctr")
    proc = subprocess.run([sys.executable, "-m", "hps.predict", "--model-dir", str(export), "--data",
                           str(csv_data / "nope.csv"), "--out", str(tmp_path / "o.csv")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "data file not found" in proc.stderr
    with pytest.raises(InvalidInputError, match="unknown must be one of"):
        hps.Predictor(export, unknown="mean")


@pytest.mark.parametrize("fmt", ["criteo", "libsvm"])
def test_criteo_and_libsvm_options_travel_with_the_export(tmp_path, fmt):
    """--int-as-categorical (Criteo) and the positional field count (libsvm, eval lines shorter than
    the first training line) are read back from model.json: the AUC is the job's."""
    from .test_train_mpi import criteo_file

    if fmt == "criteo":
        train, ev = criteo_file(tmp_path / "t.txt", n=3000), criteo_file(tmp_path / "e.txt", n=1000, seed=5)
        extra = ["--int-as-categorical"]
    else:
        rng = np.random.default_rng(2)
        for name, n, width in (("t.txt", 3000, 4), ("e.txt", 1000, 3)):
            idx = rng.integers(0, 30, (n, width))
            y = (np.sin(idx[:, 0]) + np.cos(idx[:, 1]) + 0.3 * rng.standard_normal(n) > 0).astype(int)
            (tmp_path / name).write_text("".join(f"{y[i]} " + " ".join(f"{j * 100 + v}:1" for j, v in enumerate(idx[i]))
                                                 + "\n" for i in range(n)))
        train, ev, extra = tmp_path / "t.txt", tmp_path / "e.txt", []
    cfg = parse_config(["--format", fmt, "--data", str(train), "--eval-data", str(ev), "--export", str(tmp_path / "m"),
                        *COMMON, *extra])
    metrics = run(cfg, log=lambda *a, **k: None)
    p = hps.Predictor(tmp_path / "m")
    assert p.model.n_fields == (39 if fmt == "criteo" else 4)
    probs, labels = p.predict(ev)
    assert labels.shape[0] == metrics["eval_examples"]
    assert round(auc(labels, probs), 4) == round(metrics["auc"], 4)
