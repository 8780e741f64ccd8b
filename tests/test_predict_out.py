"""``hps.predict --out`` that cannot be written is one line naming the file and why, exit 2 (it was
``hps: error: [Errno 1] …``, exit 1, after loading the model), found by the same check as the
trainer's outputs (``hps.train._preflight.check_writable``): it tries the directory, which mode bits
cannot tell for root, read-only mounts or immutable directories."""

import os
import subprocess

import numpy as np
import pytest

from hps.errors import InvalidInputError
from hps.predict._main import predict_main
from hps.train import main
from hps.train._preflight import check_outputs, check_writable
from tests.test_data_format import SMALL, _csv


@pytest.fixture
def unwritable(tmp_path):
    """A directory no file can be created in, even by root (immutable where chattr works)."""
    d = tmp_path / "locked"
    d.mkdir()
    d.chmod(0o500)
    immutable = False
    try:
        (d / "probe").touch()  # root ignores the mode bits
    except PermissionError:
        pass
    else:
        (d / "probe").unlink()
        immutable = subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
        if not immutable:
            pytest.skip("no way to make a directory unwritable here (root without chattr)")
    yield d
    if immutable:
        subprocess.run(["chattr", "-i", str(d)], check=True)
    d.chmod(0o700)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    _csv(d / "a.csv")
    assert main(["--data", str(d / "a.csv"), "--export", str(d / "model"), *SMALL]) == 0
    return d


@pytest.mark.parametrize("where, why", [
    ("locked/p.csv", "locked is not a writable directory ("),
    ("missing/p.csv", "directory {tmp}/missing does not exist"),
    (".", "is a directory, not a file"),
])
def test_an_out_that_cannot_be_written_is_one_line_and_exit_2(model, unwritable, tmp_path, capsys, where, why):
    out = tmp_path / where
    assert predict_main(["--model-dir", str(model / "model"), "--data", str(model / "a.csv"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hps: error: --out {out}") and why.format(tmp=tmp_path) in err, err
    assert err.count("\n") == 1 and "Errno" not in err


def test_the_trainer_finds_the_same_directory_unwritable(unwritable):
    from hps.config import TrainConfig

    with pytest.raises(InvalidInputError, match=f"--export {unwritable}/m: {unwritable} is not a writable directory"):
        check_outputs(TrainConfig(export=str(unwritable / "m")))
    check_writable("--out", unwritable.parent / "fine.csv", is_dir=False)  # its parent is fine
    assert os.listdir(unwritable.parent) == ["locked"]  # the tries leave nothing behind


def test_a_failed_run_leaves_out_as_it_was_and_the_data_is_never_out(model, tmp_path, capsys):
    """The scores go to a temporary file renamed over --out at the end: a run that fails (a malformed line
    under --strict, after good batches) leaves an existing --out as it was and nothing beside it; --out
    naming a --data file is refused before anything is written (it was truncated to a header)."""
    data = tmp_path / "d.csv"
    data.write_text((model / "a.csv").read_text() + "2,s1,0.5\n")   # a bad label on the last line
    out = tmp_path / "keep.csv"
    out.write_text("precious\n")
    argv = ["--model-dir", str(model / "model"), "--data", str(data), "--batch-size", "100", "--strict"]
    assert predict_main([*argv, "--out", str(out)]) == 2
    assert out.read_text() == "precious\n" and sorted(p.name for p in tmp_path.iterdir()) == ["d.csv", "keep.csv"]
    before = data.read_text()
    assert predict_main([*argv, "--out", str(data)]) == 2
    assert "is one of the --data files" in capsys.readouterr().err and data.read_text() == before
    good = ["--model-dir", str(model / "model"), "--data", str(model / "a.csv")]
    assert predict_main([*good, "--out", str(out)]) == 0     # success replaces it
    assert out.read_text().startswith("label,probability\n") and len(out.read_text().splitlines()) == 601


def test_predictor_rows_take_a_list_of_keys(model):
    from hps import Predictor

    pred = Predictor(model / "model")
    rows, found = pred.rows([1, 2])   # a list indexed by the found mask raised TypeError
    assert rows.shape[0] == 2 and found.shape == (2,)
    np.testing.assert_array_equal(rows, pred.rows(np.array([1, 2], np.uint64))[0])
