"""--early-stop exports the best model (Keras' restore_best_weights), and says which batch it is
from; hps.predict, Predictor and load_export read a checkpoint (or a --checkpoint-dir) as a model."""

import json
import shutil

import numpy as np
import pytest

import hps
from hps.errors import InvalidInputError
from hps.metrics import auc
from hps.train import load_export, main
from hps.predict._main import predict_main
from hps.formats import BEST_DIR
from tests.test_predict import _rows, _write_csv
from tests.test_train import assert_same_model

# A learning rate too high: the eval AUC peaks at batch 9 (of 8 epochs x 8 batches), early stopping
# stops at batch 13, and the model then is worse than the best.
FLAGS = ["--ignore-columns", "id", "--dense-columns", "price,hour", "--batch-size", "512", "--minibatch-size",
         "128", "--embedding-dim", "8", "--hidden", "16", "--no-progress", "--epochs", "8", "--eval-every", "2",
         "--early-stop", "2", "--lr", "2", "--dense-lr", "0.05"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("csv")
    rng = np.random.default_rng(0)
    _write_csv(d / "train.csv", _rows(rng, 4000))
    _write_csv(d / "eval.csv", _rows(rng, 1500, sites=50))
    return d


def _train(data, out, *extra):
    out.mkdir()
    assert main(["--format", "csv", "--data", str(data / "train.csv"), "--eval-data", str(data / "eval.csv"),
                 *FLAGS, "--export", str(out / "model"), "--metrics-out", str(out / "m.json"), *extra]) == 0
    return json.loads((out / "m.json").read_text())


@pytest.fixture(scope="module")
def early(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("early")
    return out, _train(data, out / "run", "--checkpoint-dir", str(out / "run" / "ck"))


def test_the_export_is_the_best_model_and_says_which_batch(data, early):
    out, m = early
    best, stop = m["best_eval"], m["early_stopped_after_batch"]
    assert stop is not None and best["batch"] < stop  # the best is not the last
    assert m["auc"] < best["auc"]  # the model at the stop is worse
    meta = json.loads((out / "run" / "model" / "model.json").read_text())
    assert meta["batch"] == best["batch"] and meta["eval_auc"] == best["auc"] and meta["best"] is True
    assert meta["source"] == f"the best model (checkpoint {best['checkpoint']})"
    assert m["exported"] == {k: meta[k] for k in ("batch", "eval_auc", "best", "source")}
    # the export's rows and dense parameters are the best checkpoint's, and score what it scored
    assert_same_model(load_export(best["checkpoint"], first_order=True),
                      load_export(out / "run" / "model", first_order=True), 0.0)
    probs, labels = hps.Predictor(out / "run" / "model").predict(data / "eval.csv")
    assert auc(labels, probs) == pytest.approx(best["auc"], abs=1e-9)


def test_the_log_says_what_was_exported(data, tmp_path, capsys):
    _train(data, tmp_path / "run", "--checkpoint-dir", str(tmp_path / "ck"))
    out = capsys.readouterr().out
    m = json.loads((tmp_path / "run" / "m.json").read_text())
    best = m["best_eval"]
    assert (f"hps: exported the best model (checkpoint {best['checkpoint']}), after batch {best['batch']}, "
            f"eval AUC {best['auc']:.4f}, to {tmp_path / 'run' / 'model'}") in out
    assert (f"the export holds the best model, after batch {best['batch']} (eval AUC {best['auc']:.4f}); "
            "the evaluation above is of the model at the end of training") in out


def test_without_a_checkpoint_dir_the_best_is_kept_for_the_export_and_removed(data, early, tmp_path):
    out, m = early
    m2 = _train(data, tmp_path / "run")
    assert m2["exported"]["batch"] == m["best_eval"]["batch"]
    assert_same_model(load_export(out / "run" / "model", first_order=True),
                      load_export(tmp_path / "run" / "model", first_order=True), 0.0)
    assert sorted(p.name for p in (tmp_path / "run" / "model").iterdir()) == \
        ["dense.h5", "model.json", "sparse-rank0-of-1.h5"]  # no BEST_DIR left
    assert not (tmp_path / "run" / "model" / BEST_DIR).exists()


def test_predict_reads_a_checkpoint_and_a_checkpoint_dir(data, early, tmp_path, capsys):
    out, m = early
    best = m["best_eval"]
    ck = out / "run" / "ck"
    for d in (ck, best["checkpoint"]):  # LATEST names the best checkpoint after early stopping
        p = hps.Predictor(d)
        assert p.meta["batch"] == best["batch"]
        probs, labels = p.predict(data / "eval.csv")
        assert auc(labels, probs) == pytest.approx(best["auc"], abs=1e-9)
        assert predict_main(["--model-dir", str(d), "--data", str(data / "eval.csv"),
                             "--out", str(tmp_path / "p.csv")]) == 0
        assert f"AUC {best['auc']:.4f}" in capsys.readouterr().out


def test_a_checkpoint_without_the_model_description_says_what_to_do(early, tmp_path):
    out, m = early
    d = tmp_path / "old"
    shutil.copytree(m["best_eval"]["checkpoint"], d)
    meta = json.loads((d / "meta.json").read_text())
    (d / "model.json").unlink()
    del meta["files"]["model.json"], meta["crc32"]
    from hps.formats._manifest import write_meta

    write_meta(d / "meta.json", meta)
    with pytest.raises(InvalidInputError, match="without the model's description.*--resume.*--export"):
        hps.Predictor(d)


def test_without_early_stop_the_export_is_the_model_at_the_end(data, tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    flags = FLAGS[:FLAGS.index("--epochs")]
    assert main(["--format", "csv", "--data", str(data / "train.csv"), "--eval-data", str(data / "eval.csv"),
                 *flags, "--epochs", "2", "--eval-every", "2", "--export", str(d / "model"),
                 "--metrics-out", str(d / "m.json")]) == 0
    meta = json.loads((d / "model" / "model.json").read_text())
    m = json.loads((d / "m.json").read_text())
    assert meta["best"] is False and meta["batch"] == 15 and meta["source"] == "the model at the end of training"
    assert meta["eval_auc"] == m["eval_curve"][-1]["auc"] == m["auc"]


def test_the_best_checkpoint_is_the_model_after_its_batch(tmp_path):
    """Nothing prepared for a later batch is in it (the pipeline runs up to 3 batches ahead, and
    with --drift every batch brings new keys): its keys are among those of the batches up to its
    own. Otherwise the export of the best model would depend on timing (and under MPI differ from
    one process reading the same shards). With --eval-every 1 every batch may be the best: every
    checkpoint is checked."""
    from hps.cli import parse_config
    from hps.train._feed import Feed
    from tests.test_train import SMALL

    flags = [*SMALL, "--epochs", "3", "--eval-every", "1", "--early-stop", "2", "--lr", "5", "--dense-lr", "0.05",
             "--expire-after", "4", "--drift", "0.2"]
    ck = tmp_path / "ck"
    assert main([*flags, "--checkpoint-dir", str(ck), "--checkpoint-every", "1", "--keep-checkpoints", "100"]) == 0
    feed, seen = Feed(parse_config(flags), 0, 1), []
    for epoch in range(3):
        seen += [np.unique(local.data.keys) for local in feed.epoch(epoch)]
    checked = 0
    for d in sorted(ck.glob("ckpt-*")):
        index = int(d.name.split("-")[1])
        keys = load_export(d)[0]
        assert np.isin(keys, np.concatenate(seen[:index + 1])).all(), d.name
        checked += 1
    assert checked >= 5
