"""The training job end to end: CLI, lossless hierarchy, checkpoints/resume, export, bad input."""

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hps.train import load_export, main
from tests.budgets import smallest_spill_budget, spill_budget
from tests.conftest import _gpu_available

SMALL = ["--rows", "12000", "--fields", "4", "--vocab-per-field", "3000", "--batch-size", "2048",
         "--minibatch-size", "256", "--hidden", "16,8", "--embedding-dim", "8", "--no-progress"]


def run_cli(tmp_path, name, *extra):
    out = tmp_path / name
    metrics = tmp_path / f"{name}.json"
    code = main([*SMALL, "--export", str(out), "--metrics-out", str(metrics), *extra])
    assert code == 0
    return load_export(out, first_order=True), json.loads(metrics.read_text())


def assert_same_model(a, b, tol):
    (ka, va, da, fa), (kb, vb, db, fb) = (x if len(x) == 4 else (*x, None) for x in (a, b))
    oa, ob = np.argsort(ka), np.argsort(kb)
    np.testing.assert_array_equal(ka[oa], kb[ob])
    assert np.abs(va[oa] - vb[ob]).max() <= tol
    assert (fa is None) == (fb is None)
    if fa is not None:
        assert np.abs(fa[oa] - fb[ob]).max() <= tol
    assert set(da) == set(db)
    for k in da:
        assert np.abs(da[k] - db[k]).max() <= tol, k


def test_default_job_reports_everything(tmp_path, capsys):
    model, m = run_cli(tmp_path, "plain", "--epochs", "3")
    for key in ("auc", "logloss", "examples_per_sec", "stage_seconds", "cache_hit_rate", "ssd_bytes_read",
                "ssd_bytes_written", "bayes_auc", "cache_hit_rate_per_batch", "bottleneck", "warmup_seconds",
                "train_cpu_seconds"):
        assert key in m, key
    assert 0 < m["train_cpu_seconds"] < 16 * m["train_seconds"] + 1  # the process's CPU time over training
    assert set(m["stage_seconds"]) >= {"read", "prepare", "place", "train"}
    assert m["examples"] == 3 * 12000
    assert 0.6 < m["auc"] <= m["bayes_auc"] + 0.01  # learned, and not above what the truth allows
    out = capsys.readouterr().out
    assert "eval AUC" in out and "bottleneck" in out
    keys, values, dense, _ = model
    assert values.shape == (keys.shape[0], 8) and "W0" in dense
    # the model, its size, and where the outputs went
    n_dense = sum(v.size for v in dense.values())
    assert "model: 4 fields x 8-dim embeddings (sum-pooled) + 4 dense -> MLP 36->16->8->1 (ReLU)" in out
    assert f"{n_dense:,} dense parameters (adam)" in out and "one row of 16 floats (8 embedding + 8 adagrad" in out
    assert (m["table_rows"], m["sparse_parameters"], m["dense_parameters"]) == (keys.shape[0], values.size, n_dense)
    assert f"model size: {keys.shape[0]:,} keys, {values.size:,} embedding parameters, {n_dense:,} dense" in out
    plain = tmp_path / "plain"
    assert f"outputs: model {plain} (read it with hps.load_export); metrics {plain}.json" in out


def test_without_eval_data_the_report_says_no_auc(tmp_path, capsys):
    data = tmp_path / "train.libfm"
    data.write_text("".join(f"{i % 2} {i % 7}:1 {100 + i % 5}:1\n" for i in range(500)))
    assert main(["--format", "libsvm", "--data", str(data), "--batch-size", "256", "--minibatch-size", "64",
                 "--hidden", "8", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "no eval data: no AUC computed (give --eval-data FILE)" in out and "eval AUC" not in out
    assert "outputs: nothing saved" in out


@pytest.mark.parametrize("model, optimizer", [("ctr", "adagrad"), ("wdl", "rowwise-adagrad"), ("deepfm", "adam"),
                                              ("dcn", "sgd"), ("dlrm", "adagrad")])
def test_spilling_to_ssd_is_lossless(tmp_path, model, optimizer):
    """A DRAM budget of ~10 % of the table (rows spill to SSD and come back) gives the same model,
    for every model (first-order weights move with their rows) and every row optimizer's state."""
    # rows of 32 + state: a MEM-PS that must hold the table's SSD-PS index at its end caches well below
    # the table (with 8 the index, which the cache lends its room while it is small, costs about a row);
    # an HBM-PS cache of 2,048-4,096 rows (1-2 working sets) beside it, so the two hold well below the table
    shape = ["--rows", "24000", "--vocab-per-field", "20000", "--batch-size", "512", "--minibatch-size", "128",
             "--model", model, "--sparse-optimizer", optimizer, "--embedding-dim", "32", "--hbm-budget", "2MiB"]
    ref, mref = run_cli(tmp_path, "mem", *shape)
    budget = spill_budget([*SMALL, *shape, "--rows-per-file", "512"], ref[0].shape[0] // 10, ref[0].shape[0])
    spill, mspill = run_cli(tmp_path, "spill", *shape, "--mem-budget", str(budget), "--rows-per-file", "512")
    assert mspill["ssd_bytes_read"] > 0 and mspill["cache_hit_rate"] < mref["cache_hit_rate"]
    assert_same_model(ref, spill, 1e-6)
    assert round(mref["auc"], 4) == round(mspill["auc"], 4)


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    full, mfull = run_cli(tmp_path, "full", "--epochs", "2")
    ck = tmp_path / "ck"
    # first run stops after epoch 1 (a checkpoint is written at every epoch end)
    run_cli(tmp_path, "half", "--epochs", "1", "--checkpoint-dir", str(ck))
    assert (ck / "LATEST").exists()
    resumed, mres = run_cli(tmp_path, "resumed", "--epochs", "2", "--checkpoint-dir", str(ck), "--resume")
    assert_same_model(full, resumed, 0.0)
    assert mres["auc"] == mfull["auc"]


def test_resuming_a_finished_run_evaluates_the_restored_model(tmp_path, capsys):
    """A checkpoint taken after the last batch: the resumed run trains nothing and must evaluate the
    restored rows (not newborn ones), so it reports the AUC of the run that wrote the checkpoint."""
    ck = tmp_path / "ck"
    first, m1 = run_cli(tmp_path, "first", "--checkpoint-dir", str(ck))
    again, m2 = run_cli(tmp_path, "again", "--checkpoint-dir", str(ck), "--resume")
    assert m2["examples"] == 0
    assert (m2["auc"], m2["logloss"]) == (m1["auc"], m1["logloss"])
    assert_same_model(first, again, 0.0)
    assert "nothing left to train" in capsys.readouterr().out


def test_checkpoint_every_and_kill_loses_nothing(tmp_path):
    """kill -9 in the middle of a run: the last checkpoint is intact and resuming from it finishes
    with exactly the parameters of an uninterrupted run."""
    ck = tmp_path / "ck"
    args = [*SMALL, "--rows", "40000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "hps.train", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while not (ck / "LATEST").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None, "the job ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL  # it died by the signal, mid-run
    meta = json.loads((ck / (ck / "LATEST").read_text().strip() / "meta.json").read_text())
    assert meta["index"] < 40000 // 2048  # the last checkpoint is not the end of the run: work was lost
    ref, _ = run_cli(tmp_path, "ref", "--rows", "40000")
    resumed, _ = run_cli(tmp_path, "resumed", "--rows", "40000", "--checkpoint-dir", str(ck), "--resume")
    assert_same_model(ref, resumed, 0.0)


@pytest.mark.parametrize("args, message", [
    (["--format", "criteo", "--data", "/nonexistent/file.tsv"], "data file not found"),
    (["--format", "orc"], "invalid choice"),
    (["--mem-budget", "64KB"], "budget"),
    (["--ssd-path", "/proc/hps-cannot-write"], "not a writable directory"),
    (["--lr", "1e30", "--dense-lr", "1e30"], "loss became"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--mem-budget", "lots"], "cannot read 'lots' as a size"),
    pytest.param(["--device", "cuda"], "no usable CUDA GPU", marks=pytest.mark.skipif(
        _gpu_available(), reason="a GPU is present")),
])
def test_bad_input_is_one_clear_line_and_nonzero_exit(args, message, tmp_path):
    base = SMALL[6:] if "--data" in args else SMALL  # the synthetic data's flags are not a file's
    proc = subprocess.run([sys.executable, "-m", "hps.train", *base, *args], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode != 0
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_toml_config_and_flags(tmp_path):
    cfg = tmp_path / "job.toml"
    cfg.write_text('rows = 4000\nbatch-size = 1024\nminibatch_size = 128\nhidden = [8]\nembedding-dim = 4\n')
    metrics = tmp_path / "m.json"
    assert main(["--config", str(cfg), "--no-progress", "--fields", "3", "--metrics-out", str(metrics)]) == 0
    m = json.loads(metrics.read_text())
    assert m["examples"] == 4000


def test_frappe_matches_the_in_memory_reference(shared_data, tmp_path):
    """Real data: hps over its tiers (with a DRAM budget that spills) ends with the AUC of the same
    model trained by the flat in-memory NumPy reference (bench/peer_torch.py) on the same mini-batches."""
    from bench.peer_torch import minibatches, train_numpy_reference
    from hps.data import open_dataset
    from hps.model import ModelConfig

    frappe = shared_data / "frappe"
    train, test = frappe / "frappe.validation.libfm", frappe / "frappe.test.libfm"
    metrics = tmp_path / "frappe.json"
    # batches of 1024 and about the smallest budget they allow: a MEM-PS that holds the SSD-PS index of
    # Frappe's 5,328 keys (rows of 10 + 10 floats) at its largest, room the cache has while the table
    # is small: fewer rows than the table, so rows spill; an HBM-PS cache of 2,048 rows (512 KiB) below
    # the table, so rows leave it for the MEM-PS. Files of 256 rows keep a compaction's batch
    # below the index's first capacity (a larger one makes the store count the index's growth by a
    # bound of twice its size)
    args = ["--format", "libsvm", "--data", str(train), "--eval-data", str(test), "--batch-size", "1024",
            "--minibatch-size", "512", "--embedding-dim", "10", "--hidden", "64,32", "--no-progress",
            "--rows-per-file", "256", "--hbm-budget", "512KiB"]
    budget = smallest_spill_budget(lambda b: subprocess.run([sys.executable, "-m", "hps.train", *args,
                                                             "--mem-budget", str(b)],
                                                            capture_output=True, text=True, timeout=300),
                                   5328, 80, rows_per_file=256)
    code = main([*args, "--mem-budget", str(budget), "--metrics-out", str(metrics)])
    assert code == 0
    m = json.loads(metrics.read_text())
    assert m["eval_examples"] == 28860 and m["ssd_bytes_read"] > 0
    tr = open_dataset(train, "libsvm", 1024)
    te = open_dataset(test, "libsvm", 1024, n_fields=tr.n_fields)
    cfg = ModelConfig(n_fields=tr.n_fields, emb_dim=10, n_dense=0, hidden=(64, 32), seed=0, sparse_lr=0.2,
                      dense_lr=1e-3, adagrad_initial_accumulator=0.001)
    ref = train_numpy_reference(list(minibatches(tr.batches(), 512)), list(te.batches()), cfg)
    assert m["auc"] > 0.9
    assert abs(m["auc"] - ref["auc"]) < 0.005, (m["auc"], ref["auc"])


def test_plots_are_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    plots = tmp_path / "plots"
    assert main([*SMALL, "--rows", "4096", "--plots", str(plots)]) == 0
    names = sorted(p.name for p in plots.glob("*.png"))
    assert names == ["cache_hit_rate.png", "loss.png", "stage_seconds.png"]
    assert all((plots / n).stat().st_size > 1000 for n in names)


def test_file_data_checkpoints_at_every_epoch_end(tmp_path):
    """Streaming readers do not know their length: the epoch end is found by looking one batch ahead."""
    rng = np.random.default_rng(0)
    lines = [f"{rng.integers(0, 2)} " + " ".join(f"{f * 100 + rng.integers(0, 50)}:1" for f in range(4))
             for _ in range(3000)]
    data = tmp_path / "train.libfm"
    data.write_text("\n".join(lines) + "\n")
    ck = tmp_path / "ck"
    assert main(["--format", "libsvm", "--data", str(data), "--batch-size", "1024", "--minibatch-size", "256",
                 "--epochs", "2", "--checkpoint-dir", str(ck), "--no-progress", "--hidden", "8"]) == 0
    meta = json.loads((ck / (ck / "LATEST").read_text().strip() / "meta.json").read_text())
    assert (meta["epoch"], meta["batch"], meta["index"]) == (1, 2, 5)  # 3 batches per epoch


def test_a_missing_checkpoint_is_reported_before_the_warm_up(tmp_path, monkeypatch):
    """--resume is checked first: a wrong --checkpoint-dir costs no kernel compile."""
    from hps.errors import InvalidInputError
    from hps.train import _warmup

    calls = []
    monkeypatch.setattr(_warmup, "warm_up", lambda *a, **k: calls.append(1) or 0.0)
    from hps.cli import parse_config
    from hps.train._trainer import Trainer

    trainer = Trainer(parse_config([*SMALL, "--resume", "--checkpoint-dir", str(tmp_path / "none")]))
    try:
        with pytest.raises(InvalidInputError, match="no checkpoint"):
            trainer.fit()
    finally:
        trainer.close()
    assert calls == []


def test_a_failing_evaluation_keeps_the_export(tmp_path, monkeypatch):
    """The model is exported before the evaluation, so a bad eval file cannot cost the trained model."""
    from hps.errors import InvalidInputError
    from hps.train._trainer import Trainer

    evaluate = Trainer.evaluate

    def bad_eval(self, batches=None):
        if batches is None:  # the job's evaluation (the warm-up passes its own batches)
            raise InvalidInputError("eval data: too many malformed lines")
        return evaluate(self, batches)

    monkeypatch.setattr(Trainer, "evaluate", bad_eval)
    out = tmp_path / "model"
    assert main([*SMALL, "--export", str(out)]) == 2
    keys, values, _ = load_export(out)
    assert keys.shape[0] > 0 and values.shape == (keys.shape[0], 8)
