"""Every hps command line takes whole flags only (no argparse abbreviations: ``--epoch`` is not
``--epochs``) and says what is wrong in one line: an unknown flag names the closest real one."""

import subprocess
import sys
from pathlib import Path

import pytest

from hps.cli import build_profile_parser as profile_parser
from hps.cli import build_predict_parser
from hps.cli import build_train_parser as build_parser

ROOT = Path(__file__).resolve().parents[1]
PREDICT = ["--model-dir", "m", "--data", "d.csv", "--out", "o.csv"]


def _error(parser, argv, capsys):
    with pytest.raises(SystemExit) as e:
        parser.parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert len(err.splitlines()) == 1, err  # one line, no usage text
    return err.strip()


@pytest.mark.parametrize("make, argv, want", [
    (build_parser, ["--epoch", "2"], "hps: error: unknown flag --epoch (did you mean --epochs?)"),
    (build_parser, ["--format", "csv", "--ignore-column", "id"],
     "hps: error: unknown flag --ignore-column (did you mean --ignore-columns?)"),
    (build_parser, ["--data", "a.csv", "--epoch=3"], "hps: error: unknown flag --epoch (did you mean --epochs?)"),
    (build_parser, ["--mem", "1g"], "hps: error: unknown flag --mem (did you mean --mem-budget?)"),
    (build_predict_parser, [*PREDICT, "--batch", "8"], "hps: error: unknown flag --batch (did you mean --batch-size?)"),
    (profile_parser, ["--hot-bytes", "1m", "--out", "p.h5", "--sample", "3"],
     "hps.profile: error: unknown flag --sample (did you mean --sample-rate?)"),
])
def test_an_abbreviation_is_an_unknown_flag_with_the_closest_named(make, argv, want, capsys):
    err = _error(make(), argv, capsys)
    assert err.startswith(want) and err.endswith("--help lists the flags"), err


def test_other_argument_errors_are_one_line(capsys):
    assert _error(build_parser(), ["--rows", "many"], capsys) == "hps: error: argument --rows: invalid int value: 'many'"
    assert "unexpected argument 'train.csv'" in _error(build_parser(), ["train.csv"], capsys)
    assert "unknown flag --zzz; " in _error(build_parser(), ["--zzz"], capsys)
    assert _error(build_predict_parser(), [], capsys) == \
        "hps: error: the following arguments are required: --model-dir, --data, --out"


def test_whole_flags_still_parse():
    assert build_parser().parse_args(["--epochs", "2"]).epochs == 2
    assert build_predict_parser().parse_args([*PREDICT, "--batch-size", "8"]).batch_size == 8


def test_every_command_line_uses_the_hps_parser():
    """No module of hps/ or bench/ builds a plain argparse parser (which takes abbreviations)."""
    plain = [str(p.relative_to(ROOT)) for d in ("hps", "bench") for p in (ROOT / d).rglob("*.py")
             if "argparse.ArgumentParser(" in p.read_text() and p.name != "_argparse.py"]
    assert plain == []


def test_the_module_prints_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "hps.train", "--epoch", "2"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "hps: error: unknown flag --epoch (did you mean --epochs?); python -m hps.train --help lists the flags"]
