"""Training control (docs/training.md, "Evaluation during training and early stopping"): --eval-every
(the eval curve), --early-stop (the stop and the best checkpoint), learning-rate schedules, the seeded
streaming shuffle, and the eval curve in --plots."""

import math
import shutil

import numpy as np
import pytest

from hps.data import Batch, SyntheticData
from hps.formats import _checkpoint
from hps.train import main
from hps.train._control import TrainingControl
from hps.train._schedule import lr_factor
from hps.train._shuffle import shuffled, take
from tests.test_train import SMALL, assert_same_model, run_cli


# -- learning-rate schedules -------------------------------------------------------------------------------

def test_lr_factor_warms_up_linearly_then_decays():
    assert [lr_factor(t, warmup=4) for t in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(0, decay="cosine", decay_steps=10) == 1.0
    assert lr_factor(5, decay="cosine", decay_steps=10) == pytest.approx(0.5)
    assert lr_factor(10, decay="cosine", decay_steps=10) == pytest.approx(0.0)
    assert lr_factor(50, decay="cosine", decay_steps=10) == pytest.approx(0.0)
    assert [lr_factor(t, decay="step", decay_steps=3) for t in (0, 2, 3, 6)] == pytest.approx([1, 1, 0.1, 0.01])
    # the decay starts after the warm-up
    assert lr_factor(4 + 5, warmup=4, decay="cosine", decay_steps=10) == pytest.approx(0.5)


def test_a_schedule_changes_training_and_a_flat_one_does_not(tmp_path):
    plain, _ = run_cli(tmp_path, "plain")
    warm, _ = run_cli(tmp_path, "warm", "--lr-warmup", "20")
    assert np.abs(plain[1] - warm[1]).max() > 1e-3
    flat, _ = run_cli(tmp_path, "flat", "--lr-warmup", "1")  # factor 1 from step 0: the plain run
    assert_same_model(plain, flat, 0.0)


def test_lr_decay_needs_its_steps(capsys):
    assert main([*SMALL, "--lr-decay", "cosine"]) == 2
    assert "--lr-decay cosine needs --lr-decay-steps" in capsys.readouterr().err


# -- the streaming shuffle ---------------------------------------------------------------------------------

def _stream(n_batches=5, size=100):
    d = SyntheticData(rows=n_batches * size - 37, fields=2, vocab_per_field=1000, seed=1, batch_size=size)
    return list(d.batches())


def test_shuffle_keeps_every_example_and_every_batch_size_and_is_seeded():
    src = _stream()
    out = list(shuffled(iter(src), 150, seed=3, shard=0, epoch=0))
    assert [len(b) for b in out] == [len(b) for b in src]
    key = lambda bs: sorted(zip(np.concatenate([b.labels for b in bs]).tolist(),  # noqa: E731
                                [tuple(b.keys[b.offsets[i]:b.offsets[i + 1]]) for b in bs for i in range(len(b))]))
    assert key(out) == key(src)
    assert not np.array_equal(np.concatenate([b.keys for b in out]), np.concatenate([b.keys for b in src]))
    again = list(shuffled(iter(src), 150, seed=3, shard=0, epoch=0))
    np.testing.assert_array_equal(np.concatenate([b.keys for b in again]), np.concatenate([b.keys for b in out]))
    other = list(shuffled(iter(src), 150, seed=3, shard=0, epoch=1))
    assert not np.array_equal(np.concatenate([b.keys for b in other]), np.concatenate([b.keys for b in out]))


def test_take_gathers_ragged_examples():
    b = Batch(np.array([1, 0, 1, 0], np.float32), np.arange(8, dtype=np.float32).reshape(4, 2),
              np.arange(10, 16, dtype=np.uint64), np.array([0, 0, 1, 2, 0, 1], np.int32), np.ones(6, np.float32),
              np.array([0, 1, 4, 4, 6]), 3)
    idx = np.array([3, 0, 2, 1, 3])
    t = take(b, idx)
    for j, i in enumerate(idx):
        np.testing.assert_array_equal(t.keys[t.offsets[j]:t.offsets[j + 1]], b.keys[b.offsets[i]:b.offsets[i + 1]])
        assert t.labels[j] == b.labels[i]
        np.testing.assert_array_equal(t.dense[j], b.dense[i])


def test_shuffled_training_differs_and_resumes_exactly(tmp_path):
    """Shuffle + warm-up + cosine decay over 2 epochs: a run resumed from the middle of epoch 0 ends
    with the uninterrupted run's model (same shuffle per epoch, same step numbers)."""
    flags = ["--epochs", "2", "--shuffle-buffer", "3000", "--lr-warmup", "5", "--lr-decay", "cosine",
             "--lr-decay-steps", "80"]
    plain, _ = run_cli(tmp_path, "plain", "--epochs", "2")
    ck = tmp_path / "ck"
    full, mf = run_cli(tmp_path, "full", *flags, "--checkpoint-dir", str(ck), "--checkpoint-every", "4",
                       "--keep-checkpoints", "3")
    assert np.abs(plain[1] - full[1]).max() > 1e-3
    for d in ("ckpt-00000007", "ckpt-00000011"):
        shutil.rmtree(ck / d)
    (ck / "LATEST").write_text("ckpt-00000003\n")
    resumed, mr = run_cli(tmp_path, "resumed", *flags, "--checkpoint-dir", str(ck), "--resume")
    assert_same_model(full, resumed, 0.0)
    assert mr["auc"] == mf["auc"]


# -- evaluation during training and early stopping ---------------------------------------------------------

def test_eval_every_records_the_curve_and_its_last_point_is_the_final_evaluation(tmp_path):
    model, m = run_cli(tmp_path, "ev", "--eval-every", "2")
    assert [c["batch"] for c in m["eval_curve"]] == [1, 3, 5]
    assert [c["examples"] for c in m["eval_curve"]] == [4096, 8192, 12000]
    last = m["eval_curve"][-1]  # taken after the last batch: the model the job ends with
    assert last["auc"] == pytest.approx(m["auc"], abs=1e-12) and last["logloss"] == pytest.approx(m["logloss"])
    plain, _ = run_cli(tmp_path, "plain")
    assert_same_model(plain, model, 0.0)  # evaluating reads the tiers and changes nothing


def test_training_control_stops_after_p_evaluations_without_improvement():
    c = TrainingControl(every=1, patience=2, window=3, checkpoint_dir="ck")
    aucs = iter([0.6, 0.7, 0.69, 0.71, 0.71, 0.5, 0.9])  # equal is no improvement
    saved = []
    for i in range(7):
        if c.skip_train(i):
            break
        c.after_batch(i, 100, lambda: (next(aucs), 0.5), lambda: saved.append(i))
    assert c.stop == 5 and saved == [0, 1, 3]
    assert c.best == {"batch": 3, "auc": 0.71, "checkpoint": "ck/ckpt-00000003"}
    assert c.pinned() == ("ckpt-00000003",) and c.skip_train(6) and not c.skip_prepare(8) and c.skip_prepare(9)
    assert [p["examples"] for p in c.curve] == [100, 200, 300, 400, 500, 600]
    d = TrainingControl(every=1, patience=2, window=3)
    d.load_state(c.state())
    assert d.state() == c.state()


def test_early_stop_stops_training_and_points_latest_at_the_best_checkpoint(tmp_path, capsys):
    ck = tmp_path / "ck"
    # a learning rate far too high: the eval AUC peaks early, then no longer improves
    _, m = run_cli(tmp_path, "es", "--epochs", "4", "--eval-every", "1", "--early-stop", "2", "--lr", "5",
                   "--dense-lr", "0.05", "--checkpoint-dir", str(ck))
    stop, best = m["early_stopped_after_batch"], m["best_eval"]
    assert stop is not None and stop < 4 * 6 - 1
    assert len(m["loss_per_batch"]) == stop + 1 == m["eval_curve"][-1]["batch"] + 1
    aucs = [c["auc"] for c in m["eval_curve"]]
    assert best["auc"] == max(aucs) and aucs.index(best["auc"]) == len(aucs) - 3  # 2 without improvement
    name = f"ckpt-{best['batch']:08d}"
    assert _checkpoint.last_checkpoint(ck).name == name == (ck / "LATEST").read_text().strip()
    assert best["checkpoint"] == str(ck / f"ckpt-{best['batch']:08d}")
    out = capsys.readouterr().out
    assert f"early stop after batch {stop}; best eval AUC {best['auc']:.4f} after batch {best['batch']}" in out


def test_resuming_from_the_best_checkpoint_remembers_the_curve_and_stops_at_the_same_batch(tmp_path):
    ck = tmp_path / "ck"
    flags = ["--epochs", "4", "--eval-every", "1", "--early-stop", "2", "--lr", "5", "--dense-lr", "0.05",
             "--checkpoint-dir", str(ck), "--checkpoint-every", "2"]
    full, mf = run_cli(tmp_path, "full", *flags)
    best = mf["best_eval"]["batch"]
    assert (ck / "LATEST").read_text().strip() == f"ckpt-{best:08d}"
    resumed, mr = run_cli(tmp_path, "resumed", *flags, "--resume")  # continues from the best model
    assert mr["early_stopped_after_batch"] == mf["early_stopped_after_batch"]
    assert mr["eval_curve"] == mf["eval_curve"] and mr["best_eval"] == mf["best_eval"]
    assert_same_model(full, resumed, 0.0)


def test_eval_every_needs_eval_data(tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("click,a\n" + "1,x\n0,y\n" * 50)
    assert main(["--format", "csv", "--data", str(data), "--eval-every", "1", "--no-progress"]) == 2
    assert "--eval-every needs eval data" in capsys.readouterr().err


def test_early_stop_needs_eval_every(capsys):
    assert main([*SMALL, "--early-stop", "2"]) == 2
    assert "--early-stop needs --eval-every" in capsys.readouterr().err


def test_plots_draw_the_eval_curve_beside_the_loss_and_name_the_run(tmp_path):
    pytest.importorskip("matplotlib")
    from hps.train._plots import _loss_and_eval, require

    metrics = {"loss_per_batch": [0.7, 0.6, 0.5], "run_name": "ctr on test.csv",
               "eval_curve": [{"batch": 0, "auc": 0.6, "logloss": 0.6}, {"batch": 2, "auc": 0.7, "logloss": 0.5}],
               "best_eval": {"batch": 2, "auc": 0.7, "checkpoint": None}}
    plt = require()
    fig = _loss_and_eval(plt, metrics)
    assert len(fig.axes) == 2  # the title (run name) is draw()'s: tests/test_train_inputs.py
    assert fig.axes[1].get_ylabel() == "eval AUC"
    np.testing.assert_array_equal(fig.axes[1].lines[0].get_ydata(), [0.6, 0.7])
    plt.close(fig)
    _, m = run_cli(tmp_path, "p", "--eval-every", "3", "--plots", str(tmp_path / "plots"))
    assert (tmp_path / "plots" / "loss.png").stat().st_size > 0 and m["run_name"].startswith("ctr on synthetic")
    assert not math.isnan(m["eval_curve"][0]["auc"])


def test_the_best_checkpoint_is_found_in_the_checkpoint_directory_of_the_resumed_run(tmp_path):
    """The best checkpoint's record (kept in checkpoints) names it as the run that saved it did, maybe
    relative to another working directory: the export takes it by name from this run's directory."""
    c = TrainingControl(every=1, patience=2, window=1, checkpoint_dir="ck")   # relative, as given then
    c.after_batch(0, 100, lambda: (0.7, 0.5), lambda: None)
    c.after_batch(1, 100, lambda: (0.6, 0.6), lambda: None)
    moved = TrainingControl(every=1, patience=2, window=1, checkpoint_dir=str(tmp_path / "elsewhere" / "ck"))
    moved.load_state(c.state())
    path, record = moved.export_choice()
    assert path == str(tmp_path / "elsewhere" / "ck" / "ckpt-00000000") and record["best"]
