"""The export is written like a checkpoint (temporary directory, fsync, atomic switch, checksums in
model.json) and read back verified: a damaged or partial export is one CorruptionError naming the
file in ``hps.load_export``, ``hps.Predictor`` and ``python -m hps.predict``; a job killed while
exporting leaves the earlier export or an incomplete one, never a damaged file read as a model."""

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import hps
from hps.errors import CorruptionError, InvalidInputError
from hps.train import load_export, main
from hps.predict._main import predict_main
from hps.formats._export import TMP_DIR
from tests.test_train import SMALL, assert_same_model

FILES = ["sparse-rank0-of-1.h5", "dense.h5", "model.json"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(an export of SMALL, one of SMALL over 2 epochs: another model)."""
    d = tmp_path_factory.mktemp("exports")
    assert main([*SMALL, "--export", str(d / "one")]) == 0
    assert main([*SMALL, "--epochs", "2", "--export", str(d / "two")]) == 0
    return d / "one", d / "two"


def _copy(src, tmp_path, name="model"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def _damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "truncate":
        data = data[:len(data) // 2]
    elif how == "flip":
        data[len(data) // 2] ^= 0x08
    else:  # the last byte: HDF5 may not even look there
        data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_the_export_records_a_checksum_of_every_file(exported):
    meta = json.loads((exported[0] / "model.json").read_text())
    assert meta["export_version"] == 2 and sorted(meta["files"]) == sorted(FILES[:2]) and "crc32" in meta
    assert meta["batch"] == 5 and meta["source"] == "the model at the end of training"
    assert sorted(p.name for p in exported[0].iterdir()) == sorted(FILES)  # nothing else left behind


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("how", ["truncate", "flip", "last byte"])
def test_a_damaged_file_is_one_line_naming_it_everywhere(exported, tmp_path, capsys, name, how):
    d = _copy(exported[0], tmp_path)
    _damage(d / name, how)
    with pytest.raises(CorruptionError) as e:
        load_export(d)
    msg = str(e.value)
    assert str(d / name) in msg and "\n" not in msg
    with pytest.raises(CorruptionError, match=str(d / name)):
        hps.Predictor(d)
    data = tmp_path / "x.csv"
    data.write_text("")
    assert predict_main(["--model-dir", str(d), "--data", str(data), "--out", str(tmp_path / "o.csv")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(d / name) in err and "Traceback" not in err


def test_a_missing_file_is_named(exported, tmp_path):
    d = _copy(exported[0], tmp_path)
    (d / "dense.h5").unlink()
    with pytest.raises(CorruptionError, match=f"{d / 'dense.h5'} is missing: the export is incomplete"):
        load_export(d)


_KILL_DURING_EXPORT = textwrap.dedent("""
    import os, signal, sys
    import h5py
    from h5py._hl.dataset import Dataset
    real = Dataset.__setitem__
    def setitem(self, key, value):  # the export shard's values are being written: kill -9 the job
        real(self, key, value)
        if self.name == "/values":
            os.kill(os.getpid(), signal.SIGKILL)
    Dataset.__setitem__ = setitem
    from hps.train import main
    main(sys.argv[1:])
""")


def _kill_while_exporting(*args):
    proc = subprocess.run([sys.executable, "-c", _KILL_DURING_EXPORT, *SMALL, *args],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]


def test_a_job_killed_while_exporting_leaves_no_model_that_reads(tmp_path):
    d = tmp_path / "model"
    _kill_while_exporting("--export", str(d))
    with pytest.raises(CorruptionError, match="incomplete export"):
        load_export(d)
    with pytest.raises(CorruptionError, match="incomplete export"):
        hps.Predictor(d)


def test_a_job_killed_while_exporting_over_an_export_leaves_the_earlier_one(exported, tmp_path):
    d = _copy(exported[0], tmp_path)
    _kill_while_exporting("--epochs", "2", "--export", str(d))
    assert_same_model(load_export(exported[0], first_order=True), load_export(d, first_order=True), 0.0)
    assert main([*SMALL, "--epochs", "2", "--export", str(d)]) == 0  # the next export replaces both
    assert_same_model(load_export(exported[1], first_order=True), load_export(d, first_order=True), 0.0)
    assert not (d / TMP_DIR).exists()


@pytest.mark.parametrize("at", range(3))
def test_a_job_killed_while_switching_the_export_in(exported, tmp_path, at):
    """Killed before each rename of the switch (the shard, dense.h5, model.json), after the earlier
    model.json went: the directory reads as an incomplete export, never as a mix of two models; the
    next export makes it whole."""
    d = _copy(exported[0], tmp_path)
    harness = textwrap.dedent(f"""
        import os, signal, sys
        from hps.formats import _export
        calls = []
        def replace(src, dst):
            if len(calls) == {at}:
                os.kill(os.getpid(), signal.SIGKILL)
            calls.append(dst)
            os.replace(src, dst)
        _export.os = type(sys)("os_with_kill")
        _export.os.__dict__.update(os.__dict__)
        _export.os.replace = replace
        from hps.train import main
        main(sys.argv[1:])
    """)
    proc = subprocess.run([sys.executable, "-c", harness, *SMALL, "--epochs", "2", "--export", str(d)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    with pytest.raises(CorruptionError, match="incomplete export"):
        load_export(d)
    assert main([*SMALL, "--export", str(d)]) == 0
    assert_same_model(load_export(exported[0], first_order=True), load_export(d, first_order=True), 0.0)


def test_an_export_by_more_ranks_is_replaced_whole(exported, tmp_path):
    d = _copy(exported[0], tmp_path)
    for r in range(3):  # an earlier export by 3 ranks (its files, by their names, are hps's)
        shutil.copy(d / "sparse-rank0-of-1.h5", d / f"sparse-rank{r}-of-3.h5")
    (d / "notes.txt").write_text("the user's")
    assert main([*SMALL, "--export", str(d)]) == 0
    assert sorted(p.name for p in d.iterdir()) == sorted(FILES + ["notes.txt"])
    assert_same_model(load_export(exported[0], first_order=True), load_export(d, first_order=True), 0.0)


def test_files_of_the_exports_names_that_no_export_wrote_are_not_replaced(exported, tmp_path, capsys):
    """A directory without model.json whose dense.h5 (or a shard) hps did not write (no "model" attribute):
    the job stops before training, naming it, and writes nothing there; the hps files a killed switch left
    are replaced."""
    import h5py

    d = tmp_path / "mine"
    d.mkdir()
    with h5py.File(d / "dense.h5", "w") as h:
        h.create_dataset("weights", data=np.arange(3.0))
    assert main([*SMALL, "--export", str(d)]) != 0
    assert "holds dense.h5 that no hps export wrote" in capsys.readouterr().err
    assert sorted(p.name for p in d.iterdir()) == ["dense.h5"]
    with h5py.File(d / "dense.h5", "r") as h:
        assert h["weights"][()].tolist() == [0.0, 1.0, 2.0]
    killed = _copy(exported[0], tmp_path, "killed")
    (killed / "model.json").unlink()                      # as a switch killed after its first step
    assert main([*SMALL, "--export", str(killed)]) == 0
    assert_same_model(load_export(exported[0], first_order=True), load_export(killed, first_order=True), 0.0)


# -- exports of older layouts: read, with a warning -----------------------------------------------------------

def _old_layout(src, tmp_path, model_json):
    d = _copy(src, tmp_path, "old")
    meta = json.loads((d / "model.json").read_text())
    if model_json:
        for k in ("files", "crc32", "batch", "source", "eval_auc"):
            meta.pop(k)
        (d / "model.json").write_text(json.dumps(dict(meta, export_version=1), indent=1))
    else:
        (d / "model.json").unlink()
    return d


@pytest.mark.parametrize("model_json", [True, False], ids=["version-1", "no-model-json"])
def test_an_older_export_is_read_with_a_warning(exported, tmp_path, model_json):
    d = _old_layout(exported[0], tmp_path, model_json)
    with pytest.warns(UserWarning, match=f"{d} is an export of an older hps.*read unverified"):
        got = load_export(d, first_order=True)
    assert_same_model(load_export(exported[0], first_order=True), got, 0.0)
    if model_json:
        with pytest.warns(UserWarning):
            assert hps.Predictor(d).n_keys == got[0].shape[0]
    else:
        with pytest.warns(UserWarning), pytest.raises(InvalidInputError, match="has no model.json"):
            hps.Predictor(d)


def test_a_damaged_file_of_an_older_export_is_still_one_line_naming_it(exported, tmp_path):
    d = _old_layout(exported[0], tmp_path, True)
    _damage(d / "sparse-rank0-of-1.h5", "truncate")
    with pytest.warns(UserWarning), pytest.raises(CorruptionError, match=str(d / "sparse-rank0-of-1.h5")) as e:
        load_export(d)
    assert "\n" not in str(e.value)
