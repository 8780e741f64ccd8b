"""--model and its flags from the command line: validation, and what every model keeps (first-order
weights through checkpoints and exports, the row optimizers over the tiers)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hps import InvalidInputError
from hps.config import ModelOptions
from hps.train import load_export, main
from hps.cli import parse_config

SMALL = ["--rows", "6000", "--fields", "4", "--vocab-per-field", "2000", "--batch-size", "1024",
         "--minibatch-size", "256", "--hidden", "16,8", "--embedding-dim", "8", "--no-progress"]


def test_model_flags_reach_the_config(tmp_path):
    cfg = parse_config(["--model", "dlrm", "--embedding-dim", "8", "--bottom-mlp", "32,8", "--top-mlp", "16",
                        "--sparse-optimizer", "rowwise-adagrad", "--dense-optimizer", "adagrad", "--emb-l2", "1e-5"])
    m = cfg.model
    assert (m.model, m.bottom_mlp, m.top_mlp, m.sparse_optimizer, m.dense_optimizer, m.emb_l2) == \
        ("dlrm", (32, 8), (16,), "rowwise-adagrad", "adagrad", 1e-5)
    toml = tmp_path / "job.toml"
    toml.write_text('model = "dcn"\ncross-layers = 4\nhidden = [8]\n')
    m = parse_config(["--config", str(toml)]).model
    assert (m.model, m.cross_layers, m.hidden) == ("dcn", 4, (8,))


def test_options_become_the_model_config():
    from hps.model import ModelConfig

    cfg = ModelConfig.from_options(ModelOptions(model="dlrm", hidden=(8,), top_mlp=(16, 4), bottom_mlp=(32, 16),
                                                 sparse_optimizer="adam", emb_l2=0.5), n_fields=3, n_dense=2, seed=7)
    assert (cfg.model, cfg.hidden, cfg.bottom_widths, cfg.n_fields, cfg.n_dense, cfg.seed) == \
        ("dlrm", (16, 4), (32, 16), 3, 2, 7)
    assert (cfg.sparse_optimizer, cfg.emb_l2, cfg.sparse_lr) == ("adam", 0.5, 0.2)
    assert ModelConfig.from_options(ModelOptions(model="dlrm"), 3, 2, 0).bottom_widths == (64, 16)
    assert ModelConfig.from_options(ModelOptions(model="dcn"), 3, 2, 0).cross_layers == 3
    assert ModelConfig.from_options(ModelOptions(model="dcn", cross_layers=5), 3, 2, 0).cross_layers == 5


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="dlrm", embedding_dim=16, bottom_mlp=(64, 8)), "bottom-mlp must end at the embedding width 16"),
    (dict(model="ctr", cross_layers=2), "--cross-layers is an option of --model dcn"),
    (dict(model="wdl", bottom_mlp=(16,)), "--bottom-mlp is an option of --model dlrm"),
    (dict(model="dcn", top_mlp=(16,)), "--top-mlp is an option of --model dlrm"),
    (dict(model="dcn", cross_layers=0), "cross-layers must be >= 1"),
    (dict(model="dlrm", top_mlp=(0,)), "top-mlp widths must be positive"),
    (dict(emb_l2=-0.1), "emb-l2 must be >= 0"),
    (dict(model="xdeepfm"), "model must be one of"),
])
def test_model_options_are_validated(kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        ModelOptions(**kwargs)


def test_bad_model_flag_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hps.train", *SMALL, "--model", "dlrm", "--bottom-mlp", "32,16"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2
    assert "bottom-mlp must end at the embedding width 8" in proc.stderr and "Traceback" not in proc.stderr


def _run(tmp_path, name, *extra):
    out, metrics = tmp_path / name, tmp_path / f"{name}.json"
    assert main([*SMALL, "--export", str(out), "--metrics-out", str(metrics), *extra]) == 0
    return load_export(out, first_order=True), json.loads(metrics.read_text())


def test_first_order_weights_are_exported_and_trained(tmp_path):
    (keys, values, dense, first), m = _run(tmp_path, "wdl", "--model", "wdl", "--epochs", "3")
    assert values.shape == (keys.shape[0], 8) and first.shape == keys.shape and first.dtype == np.float32
    assert np.abs(first).max() > 0.05  # trained: a newborn weight is within +-0.01
    assert m["auc"] > 0.6
    assert load_export(tmp_path / "wdl")[1].shape == values.shape  # the 3-tuple form still works
    (_, _, dense_ctr, none), _ = _run(tmp_path, "ctr")
    assert none is None and set(dense_ctr) == set(dense)  # wdl's dense part is ctr's MLP


@pytest.mark.parametrize("model, extra", [("deepfm", ["--sparse-optimizer", "adam"]),
                                          ("dlrm", ["--sparse-optimizer", "rowwise-adagrad", "--emb-l2", "1e-4"])])
def test_resume_reproduces_an_uninterrupted_run(tmp_path, model, extra):
    """Checkpoints carry first-order weights and every row optimizer's state (Adam's step count)."""
    args = ["--model", model, *extra]
    full, mfull = _run(tmp_path, "full", *args, "--epochs", "2")
    ck = str(tmp_path / "ck")
    _run(tmp_path, "half", *args, "--epochs", "1", "--checkpoint-dir", ck)
    resumed, mres = _run(tmp_path, "resumed", *args, "--epochs", "2", "--checkpoint-dir", ck, "--resume")
    o, r = np.argsort(full[0]), np.argsort(resumed[0])
    np.testing.assert_array_equal(full[0][o], resumed[0][r])
    np.testing.assert_array_equal(full[1][o], resumed[1][r])
    if full[3] is not None:
        np.testing.assert_array_equal(full[3][o], resumed[3][r])
    for k in full[2]:
        np.testing.assert_array_equal(full[2][k], resumed[2][k])
    assert mres["auc"] == mfull["auc"]
    other = "ctr" if model != "ctr" else "wdl"
    with pytest.raises(InvalidInputError, match=f"holds a --model {model} model"):
        from hps.config import Config
        from hps.train import run

        flat = dict(rows=6000, fields=4, vocab_per_field=2000, batch_size=1024, minibatch_size=256,
                    hidden=(16, 8), embedding_dim=8, progress=False, epochs=3, checkpoint_dir=ck, resume=True,
                    model=other)
        run(Config.from_flat(flat), log=lambda *a, **k: None)
