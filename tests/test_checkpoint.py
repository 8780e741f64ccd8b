"""Checkpoints are verified: every file's size and CRC-32 in meta.json, meta.json checksummed itself.
A damaged checkpoint is a one-line CorruptionError naming the file, or, when an older one is kept
(--keep-checkpoints), a fallback to it that ends with exactly the uninterrupted run's model.
Running out of space while checkpointing is a one-line DiskFullError that leaves nothing behind."""

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from hps.errors import CorruptionError, InvalidInputError, StoreFormatError
from hps.ssd import SSDStore
from hps.formats import _checkpoint
from hps.train import main
from hps.formats._manifest import read_meta, write_meta
from tests.test_train import SMALL, assert_same_model, run_cli

# SMALL has 12,000 rows in batches of 2,048: batches 0..5 per epoch; --checkpoint-every 2 writes
# ckpt-1, ckpt-3 and ckpt-5, and --keep-checkpoints 2 keeps ckpt-3 and ckpt-5.
NEWEST, OLDER = "ckpt-00000005", "ckpt-00000003"
SPARSE, DENSE, META = "sparse-rank0-of-1.h5", "dense.h5", "meta.json"
ROW_WIDTH = 16  # 8 embedding + 8 Adagrad columns


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the uninterrupted 2-epoch model, a checkpoint directory after epoch 1 keeping two)."""
    d = tmp_path_factory.mktemp("runs")
    full, _ = run_cli(d, "full", "--epochs", "2")
    ck = d / "ck"
    run_cli(d, "half", "--checkpoint-dir", str(ck), "--checkpoint-every", "2", "--keep-checkpoints", "2")
    return full, ck


def _copy(ck, tmp_path, drop_older=False):
    dst = tmp_path / "ck"
    shutil.copytree(ck, dst)
    if drop_older:
        shutil.rmtree(dst / OLDER)
    return dst


def _flip(path, pos, bit=0):
    data = bytearray(path.read_bytes())
    data[pos] ^= 1 << bit
    path.write_bytes(bytes(data))


def _resume(tmp_path, ck):
    return run_cli(tmp_path, "resumed", "--epochs", "2", "--checkpoint-dir", str(ck), "--resume")


def test_keep_checkpoints_keeps_the_k_newest(runs, tmp_path):
    _, ck = runs
    assert sorted(p.name for p in ck.iterdir()) == ["LATEST", "LOCK", OLDER, NEWEST]
    assert (ck / "LATEST").read_text().strip() == NEWEST
    run_cli(tmp_path, "one", "--checkpoint-dir", str(tmp_path / "ck1"), "--checkpoint-every", "2")
    assert sorted(p.name for p in (tmp_path / "ck1").iterdir()) == ["LATEST", "LOCK", NEWEST]


def test_every_flipped_bit_is_caught(runs, tmp_path):
    d = _copy(runs[1], tmp_path) / NEWEST
    _checkpoint._check(d, 0, 1, ROW_WIDTH)  # intact
    for name in (META, DENSE, SPARSE):
        path = d / name
        size = path.stat().st_size
        positions = range(size) if name == META else sorted({0, size - 1, *range(7, size, size // 40)})
        for pos in positions:
            for bit in range(8) if name == META else (pos % 8,):
                _flip(path, pos, bit)
                with pytest.raises(CorruptionError, match=name):
                    _checkpoint._check(d, 0, 1, ROW_WIDTH)
                _flip(path, pos, bit)
    _checkpoint._check(d, 0, 1, ROW_WIDTH)


def _damage(d, how):
    if how == "flip-sparse":
        _flip(d / SPARSE, (d / SPARSE).stat().st_size // 2, 3)
    elif how == "flip-dense":
        _flip(d / DENSE, (d / DENSE).stat().st_size // 2, 5)
    elif how == "flip-meta":
        _flip(d / META, 20, 0)
    elif how == "truncate-sparse":
        with open(d / SPARSE, "r+b") as f:
            f.truncate(1000)
    elif how == "missing-dense":
        (d / DENSE).unlink()
    elif how == "truncate-meta":
        (d / META).write_bytes((d / META).read_bytes()[:40])
    elif how == "garbage-meta":
        (d / META).write_bytes(os.urandom(200))
    elif how == "empty-meta":
        (d / META).write_bytes(b"")
    elif how == "list-meta":
        (d / META).write_text("[1, 2]")
    elif how == "edited-meta":  # valid JSON, a value changed, the checksum left as it was
        meta = json.loads((d / META).read_text())
        meta["files"][SPARSE]["bytes"] += 1
        (d / META).write_text(json.dumps(meta))
    else:
        raise AssertionError(how)


DAMAGE = ["flip-sparse", "flip-dense", "flip-meta", "truncate-sparse", "missing-dense", "truncate-meta",
          "garbage-meta", "empty-meta", "list-meta", "edited-meta"]
NAMED = {"flip-sparse": SPARSE, "truncate-sparse": SPARSE, "flip-dense": DENSE, "missing-dense": DENSE}


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_checkpoint_without_an_older_one_is_one_clear_line(runs, tmp_path, capsys, how):
    ck = _copy(runs[1], tmp_path, drop_older=True)
    _damage(ck / NEWEST, how)
    assert main([*SMALL, "--epochs", "2", "--checkpoint-dir", str(ck), "--resume"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert str(ck / NEWEST / NAMED.get(how, META)) in err
    assert "no older intact checkpoint is kept" in err and "--keep-checkpoints" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("how", ["flip-sparse", "flip-dense", "flip-meta", "missing-dense"])
def test_resume_falls_back_to_the_older_checkpoint_and_ends_with_the_uninterrupted_model(runs, tmp_path,
                                                                                        capsys, how):
    full, ck0 = runs
    ck = _copy(ck0, tmp_path)
    _damage(ck / NEWEST, how)
    resumed, _ = _resume(tmp_path, ck)
    out = capsys.readouterr().out
    assert str(ck / NEWEST / NAMED.get(how, META)) in out
    assert f"resuming from {ck / OLDER} instead" in out
    assert f"resumed from {ck / OLDER} (after batch 3" in out
    assert_same_model(full, resumed, 0.0)


@pytest.mark.parametrize("how", ["damaged", "missing"])
def test_a_bad_latest_file_falls_back_to_the_newest_intact_checkpoint(runs, tmp_path, capsys, how):
    full, ck0 = runs
    ck = _copy(ck0, tmp_path)
    if how == "damaged":
        (ck / "LATEST").write_bytes(b"\xff\x00garbage")
    else:
        (ck / "LATEST").unlink()
    resumed, _ = _resume(tmp_path, ck)
    out = capsys.readouterr().out
    assert f"{ck / 'LATEST'} is {how}" in out and f"resuming from {ck / NEWEST} instead" in out
    assert f"resumed from {ck / NEWEST} (after batch 5" in out
    assert_same_model(full, resumed, 0.0)


def test_keep_checkpoints_must_be_positive(capsys):
    assert main([*SMALL, "--keep-checkpoints", "0"]) == 2
    assert "keep-checkpoints must be positive, got 0" in capsys.readouterr().err


def test_version_1_checkpoints_still_resume(runs, tmp_path, capsys):
    """Checkpoints written before checksums (version 1: no "files", no "crc32") resume, unverified."""
    full, ck0 = runs
    ck = _copy(ck0, tmp_path, drop_older=True)
    meta = read_meta(ck / NEWEST / META)
    del meta["files"]
    (ck / NEWEST / META).write_text(json.dumps(dict(meta, version=1), indent=1))
    resumed, _ = _resume(tmp_path, ck)
    assert "version-1 checkpoint, written without checksums" in capsys.readouterr().out
    assert_same_model(full, resumed, 0.0)


def test_a_newer_checkpoint_version_is_a_clear_error(runs, tmp_path):
    ck = _copy(runs[1], tmp_path, drop_older=True)
    meta = read_meta(ck / NEWEST / META)
    write_meta(ck / NEWEST / META, dict(meta, version=99))
    with pytest.raises(StoreFormatError, match="checkpoint version 99; this hps reads versions 1, 2"):
        _checkpoint._check(ck / NEWEST, 0, 1, ROW_WIDTH)


# -- disk full --------------------------------------------------------------------------------------------
def _disk_full():
    """The OSError h5py raises when the device is full (got by writing to /dev/full): two lines."""
    import h5py

    try:
        with h5py.File("/dev/full", "w"):
            pass
    except OSError as e:
        return e
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # no /dev/full on this system


def _fail_second_call(monkeypatch, owner, attr, when=lambda *a, **k: True, partial=None):
    """Make the second call of ``owner.attr`` that ``when`` selects run out of space (after writing
    ``partial(*args)`` bytes, like a write cut short)."""
    real, calls = getattr(owner, attr), []

    def failing(*args, **kwargs):
        if when(*args, **kwargs):
            calls.append(args)
            if len(calls) == 2:
                if partial is not None:
                    Path(partial(*args)).write_bytes(b"\0" * 4096)
                raise _disk_full()
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attr, failing)


@pytest.mark.parametrize("step", ["sparse", "dense", "latest"])
def test_disk_full_while_checkpointing_is_one_line_and_leaves_the_previous_checkpoint(
        runs, tmp_path, monkeypatch, capsys, step):
    if step == "sparse":
        _fail_second_call(monkeypatch, SSDStore, "export_h5")  # into an open HDF5 file: it stays behind
    elif step == "dense":
        _fail_second_call(monkeypatch, _checkpoint, "_write_dense", partial=lambda path, *a: path)
    else:
        _fail_second_call(monkeypatch, _checkpoint, "fsync_path",
                          when=lambda path, directory=False: path.name == ".LATEST.tmp")
    ck = tmp_path / "ck"
    assert main([*SMALL, "--checkpoint-dir", str(ck), "--checkpoint-every", "2"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "DiskFullError" in err and "no space left on the device while writing checkpoint ckpt-00000003" in err
    assert f"the previous checkpoint {ck / 'ckpt-00000001'} is intact" in err
    assert sorted(p.name for p in ck.iterdir()) == ["LATEST", "LOCK", "ckpt-00000001"]
    monkeypatch.undo()
    resumed, _ = _resume(tmp_path, ck)
    assert_same_model(runs[0], resumed, 0.0)


def test_last_checkpoint_names_what_resume_would_use(runs, tmp_path):
    """The interrupt hint and the outputs line follow the fallback: with LATEST damaged, the newest
    intact checkpoint kept; with every meta.json damaged, none."""
    _, ck = runs
    ck = _copy(ck, tmp_path)
    assert _checkpoint.last_checkpoint(ck) == ck / NEWEST
    (ck / "LATEST").write_text("garbage\n")
    assert _checkpoint.last_checkpoint(ck) == ck / NEWEST
    _flip(ck / NEWEST / META, 5)
    assert _checkpoint.last_checkpoint(ck) == ck / OLDER
    _flip(ck / OLDER / META, 5)
    assert _checkpoint.last_checkpoint(ck) is None


def test_a_complete_save_removes_what_killed_saves_left(tmp_path):
    """A .tmp-ckpt-N left by a save that was killed mid-write goes at the next complete save."""
    ck = tmp_path / "ck"
    stale = ck / ".tmp-ckpt-00000099"
    stale.mkdir(parents=True)
    (stale / SPARSE).write_bytes(b"partial")
    run_cli(tmp_path, "run", "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    assert sorted(p.name for p in ck.iterdir()) == ["LATEST", "LOCK", NEWEST]


def test_one_job_at_a_time_writes_into_a_checkpoint_directory(tmp_path, capsys):
    """A second job on a --checkpoint-dir in use stops at once, naming the holder (its pruning would
    remove the first's unfinished checkpoint, its --resume load the first's model); the lock goes
    with the job."""
    from hps.errors import StoreLockedError
    from hps.train._collectives import Collectives

    ck = tmp_path / "ck"
    with _checkpoint.locked(ck, Collectives().main):
        assert f"pid {os.getpid()}" in (ck / "LOCK").read_text()
        with pytest.raises(StoreLockedError, match=rf"{ck} is in use by another job \(pid {os.getpid()} on"):
            with _checkpoint.locked(ck, Collectives().main):
                pass
        assert main([*SMALL, "--checkpoint-dir", str(ck)]) != 0
        assert "give each job its own --checkpoint-dir" in capsys.readouterr().err
        assert not (ck / "LATEST").exists()        # the refused job wrote nothing
    run_cli(tmp_path, "after", "--checkpoint-dir", str(ck), "--checkpoint-every", "2")  # free again
    assert (ck / NEWEST).is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(InvalidInputError, match="cannot write --checkpoint-dir"):   # typed, on every rank
        with _checkpoint.locked(tmp_path / "file" / "ck", Collectives().main):
            pass


def test_a_directory_named_like_a_checkpoint_that_is_not_one_is_left_alone(tmp_path):
    """hps removes only checkpoints it wrote: a ckpt-N directory without a readable meta.json stays,
    and one in the way of a checkpoint being saved stops the save instead of being replaced."""
    ck = tmp_path / "ck"
    for name in ("ckpt-00000099", NEWEST):
        (ck / name).mkdir(parents=True)
        (ck / name / "notes.txt").write_text("mine")
    with pytest.raises(AssertionError):       # the save of batch 5 finds NEWEST in its way: the job fails
        run_cli(tmp_path, "run", "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    assert (ck / NEWEST / "notes.txt").read_text() == "mine"
    shutil.rmtree(ck / NEWEST)
    run_cli(tmp_path, "run2", "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    assert (ck / "ckpt-00000099" / "notes.txt").read_text() == "mine" and (ck / NEWEST / META).is_file()


def test_a_resume_with_other_layer_widths_says_what_to_do(runs, tmp_path, capsys):
    ck = _copy(runs[1], tmp_path)
    args = [a for a in SMALL if a not in ("--hidden", "16,8")]
    assert main([*args, "--hidden", "32,8", "--epochs", "2", "--checkpoint-dir", str(ck), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint {ck / NEWEST} holds a ctr model of other shapes" in err and "--hidden" in err
    assert "Traceback" not in err


def test_a_resume_takes_the_dense_learning_rate_of_its_command_line(runs, tmp_path):
    """The dense optimizer's state and step come from the checkpoint, its hyperparameters from the job's
    options, as the rows' --lr: the same command resumes exactly, another --dense-lr trains with it."""
    full, ck0 = runs
    same, _ = _resume(tmp_path, _copy(ck0, tmp_path))
    assert_same_model(full, same, 0.0)
    other, _ = run_cli(tmp_path, "other", "--epochs", "2", "--checkpoint-dir", str(_copy(ck0, tmp_path / "o")),
                       "--resume", "--dense-lr", "0.05")
    assert max(float(abs(other[2][k] - full[2][k]).max()) for k in full[2]) > 1e-4   # the dense part differs


def test_checkpoint_every_without_a_directory_says_it_writes_nothing(tmp_path, capsys):
    run_cli(tmp_path, "run", "--checkpoint-every", "2")
    assert "hps: warning: --checkpoint-every without --checkpoint-dir writes no checkpoint" in capsys.readouterr().out
