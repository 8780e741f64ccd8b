"""Bad input to ``python -m hps.train`` fails at the start with one clear line and exit code 2, and
malformed lines that a job skips are reported on the console and in the metrics."""

import json
import os
import subprocess
import sys

import pytest

from hps.cli import parse_config

SMALL = ["--rows", "2000", "--fields", "3", "--vocab-per-field", "500", "--batch-size", "512",
         "--minibatch-size", "128", "--hidden", "8", "--embedding-dim", "4", "--no-progress"]


def hps_train(*args, cwd, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "hps.train", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd, env=env)


def assert_fails_at_start(proc, *needles):
    """Exit 2, one line on stderr holding every needle, no traceback, nothing trained."""
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("hps: error: "), proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    assert "hps: training" not in proc.stdout and "trained" not in proc.stdout


def _libsvm_lines(n, bad=()):
    return "".join(("7 1:1" if i in bad else f"{i % 2} {i % 97}:1 {100 + i % 89}:1 {200 + i % 83}:0.5")
                   + "\n" for i in range(n))


# --- item 3: wrong input trains nothing ------------------------------------------------------------
def test_criteo_format_on_a_csv_file(tmp_path):
    (tmp_path / "t.csv").write_text("click,a,b\n1,x,y\n0,z,w\n")
    proc = hps_train("--format", "criteo", "--data", "t.csv", "--no-progress", cwd=tmp_path)
    assert_fails_at_start(proc, "no valid example in t.csv", "t.csv:1:", "expected Criteo TSV")


def test_csv_label_column_not_0_1(tmp_path):
    (tmp_path / "l.csv").write_text("click,a,b\n2,x,y\nyes,z,w\n")
    proc = hps_train("--format", "csv", "--data", "l.csv", "--no-progress", cwd=tmp_path)
    assert_fails_at_start(proc, "l.csv:2: unparseable label", "label column 'click' 0/1")


def test_malformed_lines_are_reported_and_the_threshold_stops_the_job(tmp_path):
    """2 % malformed lines (one a float32 overflow, 1e39): over the default 1 % the job stops before
    training; with --max-malformed 0.05 it trains and reports them by file:line."""
    text = _libsvm_lines(600, bad={5, 50, 100, 150, 200, 250, 300, 350, 400, 450, 500})
    text = text.replace("\n", "\n1 3:1e39 4:1\n", 1)  # line 2: finite in float64, inf in float32
    (tmp_path / "d.libsvm").write_text(text)
    base = ["--format", "libsvm", "--data", "d.libsvm", "--batch-size", "256", "--minibatch-size", "64",
            "--hidden", "8", "--no-progress"]
    proc = hps_train(*base, cwd=tmp_path)
    assert_fails_at_start(proc, "12 of the 601 lines of d.libsvm are malformed", "max_malformed 1.00%",
                          "d.libsvm:2: unparseable or out-of-range number", "--max-malformed")
    proc = hps_train(*base, "--max-malformed", "0.05", "--metrics-out", "m.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ("skipped 12 malformed lines of the training data (per pass); first: d.libsvm:2: unparseable or "
            "out-of-range number; d.libsvm:7: unparseable label; d.libsvm:52: unparseable label; …") in proc.stdout
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["malformed_lines"] == 12 and m["examples"] == 601 - 12
    assert m["malformed_first"][:2] == ["d.libsvm:2: unparseable or out-of-range number",
                                        "d.libsvm:7: unparseable label"]
    assert len(m["malformed_first"]) == 10


# --- item 12: bad values that ended in a traceback ---------------------------------------------------
@pytest.mark.parametrize("content, needle", [
    ("", "no valid example in e.libsvm: no data lines"),
    ("garbage\nmore garbage\n", "no valid example in e.libsvm: all 2 lines are malformed"),
])
def test_empty_or_garbage_eval_data(tmp_path, content, needle):
    (tmp_path / "d.libsvm").write_text(_libsvm_lines(300))
    (tmp_path / "e.libsvm").write_text(content)
    proc = hps_train("--format", "libsvm", "--data", "d.libsvm", "--eval-data", "e.libsvm", "--no-progress",
                     cwd=tmp_path)
    assert_fails_at_start(proc, needle, "expected libsvm")


def test_binary_config_file(tmp_path):
    (tmp_path / "job.toml").write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe rows = 1\n")
    assert_fails_at_start(hps_train("--config", "job.toml", cwd=tmp_path), "job.toml is not UTF-8 text")


@pytest.mark.parametrize("seed", ["18446744073709551617", "18446744073709551616", "-1"])
def test_seed_outside_uint64(tmp_path, seed):
    assert_fails_at_start(hps_train(*SMALL, "--seed", seed, cwd=tmp_path), "seed must be an integer in "
                          "[0, 2**64 - 1]", seed)


def test_largest_seed_trains(tmp_path):
    proc = hps_train(*SMALL, "--rows", "600", "--seed", str(2**64 - 1), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("args, needles", [
    (["--embedding-dim", "100000000"], ["GiB of memory", "but its memory budget is", "--embedding-dim"]),
    (["--hidden", "4000000000"], ["TiB of memory", "--hidden"]),
    (["--hbm-capacity", "100000000000"], ["HBM-PS slot keys 2.0 TiB", "--hbm-capacity"]),
    (["--fields", "65537"], ["fields must be between 1 and 65535"]),
    (["--format", "libsvm", "--data", "x.libsvm", "--libsvm-fields", "70000"], ["libsvm-fields must be between 1 and 65535"]),
])
def test_sizes_beyond_the_machine_or_the_key_layout(tmp_path, args, needles):
    (tmp_path / "x.libsvm").write_text("1 1:1\n")
    base = SMALL[6:] if "--format" in args else SMALL  # the synthetic data's flags are not a file's
    assert_fails_at_start(hps_train(*base, *args, cwd=tmp_path, timeout=60), *needles)


# --- item 5: fail before training --------------------------------------------------------------------
def test_plots_without_matplotlib_fail_before_training(tmp_path):
    fake = tmp_path / "site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib (test stand-in)')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), *sys.path]))
    proc = hps_train(*SMALL, "--plots", "plots", cwd=tmp_path, env=env)
    assert_fails_at_start(proc, "--plots needs matplotlib")


@pytest.mark.parametrize("toml, needle", [
    ('rows = "4000"\n', "option rows must be an integer (or unset), got '4000' (str)"),
    ("lr = true\n", "option lr must be a finite number, got True (bool)"),
    ("hidden = [8, 'x']\n", "option hidden must be a list of integers"),
    ('mem-budget = [1]\n', "option mem-budget must be an integer or a string (or unset)"),
    ("[model]\nrows = 10\n", "[model] has no option rows (it belongs in [data])"),
    ("[dataset]\nrows = 10\n", "unknown section [dataset]"),
    ("rows = 10\n[data]\nrows = 20\n", "option rows is given twice (at the top level and in [data])"),
    ("no-progress = 1\n", "option no-progress must be true or false"),
])
def test_toml_values_of_the_wrong_type_or_place(tmp_path, toml, needle):
    (tmp_path / "job.toml").write_text(toml)
    assert_fails_at_start(hps_train("--config", "job.toml", cwd=tmp_path), needle)


def test_toml_sections_aliases_and_binary_sizes(tmp_path):
    """Sections are namespaces of the subsystems; no-progress/no_progress are keys; sizes take
    binary units in every spelling."""
    job = tmp_path / "job.toml"
    job.write_text('no-progress = true\n[data]\nrows = 3000\nvocab-per-field = 700\n[model]\nhidden = [8]\n'
                   '[tiers]\nmem_budget = "1GiB"\n[train]\nbatch_size = 1024\n')
    cfg = parse_config(["--config", str(job)])
    assert (cfg.data.rows, cfg.data.vocab_per_field, cfg.model.hidden) == (3000, 700, (8,))
    assert (cfg.tiers.mem_budget, cfg.train.batch_size, cfg.train.progress) == (1 << 30, 1024, False)
    job.write_text("no_progress = false\n")
    assert parse_config(["--config", str(job)]).train.progress is True
    for text, size in (("1GiB", 1 << 30), ("2g", 2 << 30), ("512MB", 512 << 20), ("1.5 TiB", 3 << 39),
                       ("64kib", 64 << 10), ("4096", 4096), ("10B", 10)):
        assert parse_config(["--mem-budget", text]).tiers.mem_budget == size, text


def test_unwritable_outputs_fail_before_training(tmp_path):
    (tmp_path / "file").write_text("")
    proc = hps_train(*SMALL, "--metrics-out", "missing-dir/m.json", cwd=tmp_path)
    assert_fails_at_start(proc, "--metrics-out missing-dir/m.json: directory missing-dir does not exist")
    proc = hps_train(*SMALL, "--export", "file/model", cwd=tmp_path)
    assert_fails_at_start(proc, "--export file/model: file is not a writable directory")


def test_eval_data_with_another_layout_fails_before_training(tmp_path):
    """A CSV eval file without a column of the training data's fields would only fail in the evaluation
    after training: it fails at start, naming the column."""
    (tmp_path / "t.csv").write_text("click,a,b\n" + "".join(f"{i % 2},x{i % 7},y{i % 5}\n" for i in range(200)))
    (tmp_path / "e.csv").write_text("click,a\n1,x1\n0,x2\n")
    proc = hps_train("--format", "csv", "--data", "t.csv", "--eval-data", "e.csv", "--no-progress", cwd=tmp_path)
    assert_fails_at_start(proc, "--eval-data: categorical column(s) ['b'] not in the columns of the CSV header of "
                                "e.csv")


def test_libsvm_eval_data_takes_the_training_fields(tmp_path):
    """Positional fields: an eval file whose first line is shorter still has the training data's fields."""
    (tmp_path / "d.libsvm").write_text(_libsvm_lines(300))
    (tmp_path / "e.libsvm").write_text("1 5:1\n" + _libsvm_lines(50))
    proc = hps_train("--format", "libsvm", "--data", "d.libsvm", "--eval-data", "e.libsvm", "--no-progress",
                     "--hidden", "8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "eval AUC" in proc.stdout and "on 51 examples" in proc.stdout
