"""``--ssd-path``: a job claims its own rank directory, never deletes what it did not create, refuses a
path another job holds (naming that job), reclaims one whose job provably died (kill -9, a reboot, a
pid reused) removing only what hps made, and removes its store at the end unless ``--keep-ssd``."""

import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from hps.errors import InvalidInputError
from hps.ssd import SSDStore
from hps.train import Trainer, _ssd_dir, load_export, main
from hps.cli import parse_config
from tests.budgets import spill_budget
from tests.test_train import SMALL, assert_same_model, run_cli

ROWS = ["--rows", "4096"]


@functools.cache
def budget() -> str:
    """A --mem-budget whose MEM-PS caches 1,500 rows, below the table (~4,800 rows): rows spill to the SSD-PS."""
    return str(spill_budget([*SMALL, *ROWS], 1500, 12_000))


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_foreign_files_are_refused_and_kept(tmp_path, capsys):
    rank_dir = tmp_path / "ssd" / "rank0-of-1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "notes.txt").write_text("mine")
    (rank_dir / "store").mkdir()  # the name hps gives its own store: still not hps's
    (rank_dir / "store" / "data.bin").write_bytes(b"1234")
    assert main([*SMALL, *ROWS, "--ssd-path", str(tmp_path / "ssd")]) == 2
    err = capsys.readouterr().err
    assert "holds files hps did not create (notes.txt, store)" in err and str(rank_dir) in err
    assert len(err.strip().splitlines()) == 1
    assert _tree(rank_dir) == ["notes.txt", "store", "store/data.bin"]
    assert (rank_dir / "notes.txt").read_text() == "mine"


def test_the_store_is_removed_at_the_end_with_the_directories_the_job_made(tmp_path):
    ssd = tmp_path / "made" / "ssd"  # neither exists: the job makes both and removes both
    assert main([*SMALL, *ROWS, "--ssd-path", str(ssd)]) == 0
    assert not (tmp_path / "made").exists()


def test_an_empty_rank_directory_is_used_and_left_as_found(tmp_path):
    rank_dir = tmp_path / "ssd" / "rank0-of-1"
    rank_dir.mkdir(parents=True)
    (tmp_path / "ssd" / "other.txt").write_text("the root may hold anything")
    assert main([*SMALL, *ROWS, "--ssd-path", str(tmp_path / "ssd")]) == 0
    assert _tree(tmp_path / "ssd") == ["other.txt", "rank0-of-1"]


def test_keep_ssd_keeps_the_store_and_the_next_job_refuses_to_delete_it(tmp_path, capsys):
    ssd = tmp_path / "ssd"
    assert main([*SMALL, *ROWS, "--ssd-path", str(ssd), "--keep-ssd", "--mem-budget", budget()]) == 0
    store = ssd / "rank0-of-1" / "store"
    assert f"SSD-PS kept in {store} (--keep-ssd)" in capsys.readouterr().out
    with SSDStore(store, dim=16) as s:  # 8 embedding + 8 Adagrad columns
        assert len(s) > 0  # the MEM-PS budget spilled rows to it
    before = _tree(ssd)
    assert main([*SMALL, *ROWS, "--ssd-path", str(ssd)]) == 2
    err = capsys.readouterr().err
    assert "holds the SSD-PS of an earlier job" in err and f"pid {os.getpid()}" in err
    assert "kept with --keep-ssd" in err
    assert _tree(ssd) == before


def test_a_second_job_on_the_same_path_is_refused_and_the_first_is_unharmed(tmp_path):
    """The first job (this process) holds the path; the second (a subprocess) must neither delete nor
    reuse its store, and must say which job holds it. The first then trains to the exact model."""
    ssd = tmp_path / "ssd"
    first = Trainer(parse_config([*SMALL, "--ssd-path", str(ssd), "--mem-budget", budget()]))
    try:
        second = subprocess.run([sys.executable, "-m", "hps.train", *SMALL, *ROWS, "--ssd-path", str(ssd)],
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 1, second.stderr
        assert f"is in use by another job (pid {os.getpid()} on " in second.stderr
        assert "Traceback" not in second.stderr
        first.fit()
        first.export(str(tmp_path / "first"))
    finally:
        first.close()
    assert not ssd.exists()
    ref, _ = run_cli(tmp_path, "ref", "--mem-budget", budget())
    assert_same_model(ref, load_export(tmp_path / "first"), 0.0)


# -- a job killed with kill -9: the next job of the path reclaims what hps made, nothing else ---------------

_STOP_AFTER_SECOND_CHECKPOINT = textwrap.dedent("""
    import sys, time
    from hps.formats import _checkpoint
    from hps.train import main
    real, calls = _checkpoint.save, []
    def save(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out)
        if len(calls) == 2:  # mid-job, its SSD-PS holding spilled rows: wait to be killed
            print("CHECKPOINTED", flush=True)
            time.sleep(600)
        return out
    _checkpoint.save = save
    sys.exit(main(sys.argv[1:]))
""")


def _flags(tmp_path):
    return [*SMALL, "--epochs", "2", "--ssd-path", str(tmp_path / "ssd"), "--mem-budget", budget(),
            "--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "2"]


def _kill_9(tmp_path):
    """Run the job of ``_flags`` in a subprocess, ``kill -9`` it after its second checkpoint -> its pid.
    Its rank directory is left with its JOB file and SSD-PS."""
    proc = subprocess.Popen([sys.executable, "-c", _STOP_AFTER_SECOND_CHECKPOINT, *_flags(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.strip() == "CHECKPOINTED":
                break
        else:
            raise AssertionError(f"the job ended before its second checkpoint: {proc.stderr.read()[-2000:]}")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        proc.kill()
        proc.stdout.close()
        proc.stderr.close()
    rank_dir = tmp_path / "ssd" / "rank0-of-1"
    assert (rank_dir / "JOB").is_file() and any(p.suffix == ".param" for p in (rank_dir / "store").iterdir())
    return proc.pid


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    model, _ = run_cli(d, "ref", "--epochs", "2", "--mem-budget", budget())
    return model


@pytest.mark.parametrize("resume", [True, False], ids=["resume", "restart"])
def test_a_job_killed_with_kill_9_is_reclaimed_by_the_next_one(tmp_path, capsys, uninterrupted, resume):
    pid = _kill_9(tmp_path)
    rank_dir = tmp_path / "ssd" / "rank0-of-1"
    n_files = len(list((rank_dir / "store").iterdir()))
    out_dir = tmp_path / "model"
    assert main([*_flags(tmp_path), *(["--resume"] if resume else []), "--export", str(out_dir)]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "reclaimed" in line]
    assert said == [f"hps: reclaimed --ssd-path {rank_dir} from an earlier job that did not finish (pid {pid} on "
                    f"{socket.gethostname()}, started {said[0].split('started ')[1].split(';')[0]}; process {pid} "
                    f"is gone): removed its SSD-PS ({n_files} files)"], out
    assert not (tmp_path / "ssd").exists()  # this job's own store went at its end, as always
    assert ("resumed from" in out) == resume
    assert_same_model(uninterrupted, load_export(out_dir, first_order=True), 0.0)  # resumed or from scratch


@pytest.mark.parametrize("where", ["rank0-of-1/notes.txt", "rank0-of-1/store/notes.txt", "rank0-of-1/store/sub/"])
def test_a_foreign_file_in_a_dead_jobs_directory_stops_the_reclaim(tmp_path, capsys, where):
    """hps removes only what it made: with a file of another name there, it touches nothing and
    refuses, naming it; once the file is moved away, the next job reclaims the rest."""
    _kill_9(tmp_path)
    foreign = tmp_path / "ssd" / where
    if where.endswith("/"):
        foreign.mkdir()
    else:
        foreign.write_text("the user's")
    before = _tree(tmp_path / "ssd")
    assert main(_flags(tmp_path)) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    name = where.split("/", 1)[1].rstrip("/")
    assert f"and files hps did not create ({name})" in err and "left everything as it was" in err
    assert _tree(tmp_path / "ssd") == before
    if foreign.is_dir():
        foreign.rmdir()
    else:
        foreign.unlink()
    assert main(_flags(tmp_path)) == 0
    assert "reclaimed --ssd-path" in capsys.readouterr().out


def _job_dir(tmp_path, **info):
    """A rank directory as a job of ``info`` would have left it (JOB and an SSD-PS with rows)."""
    rank_dir = tmp_path / "ssd" / "rank0-of-1"
    rank_dir.mkdir(parents=True)
    job = {"host": socket.gethostname(), "started": "2026-01-01 00:00:00", "keep": False, **info}
    (rank_dir / "JOB").write_text(json.dumps(job))
    with SSDStore(rank_dir / "store", dim=4) as s:
        s.dump(np.arange(10, dtype=np.uint64), np.ones((10, 4), np.float32))
    return rank_dir


@pytest.fixture
def other_program():
    proc = subprocess.Popen(["sleep", "600"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_a_pid_now_used_by_another_program_is_recognised(tmp_path, other_program):
    ticks = _ssd_dir._start_ticks(other_program)
    if ticks is None:
        pytest.skip("no /proc/<pid>/stat here")
    rank_dir = _job_dir(tmp_path, pid=other_program, start_ticks=ticks + 1, boot_id=_ssd_dir._boot_id())
    said = []
    d = _ssd_dir.SSDDir.claim(tmp_path / "ssd", 0, 1, log=said.append)
    d.release()
    assert len(said) == 1 and f"process {other_program} is now another program" in said[0]
    assert _tree(rank_dir) == []  # its JOB lists no directory it made: the empty one stays


def test_a_killed_job_not_yet_reaped_is_recognised(tmp_path):
    """A job killed with kill -9 whose parent has not reaped it yet (a zombie, state Z in
    /proc/<pid>/stat) runs no more: its directory is reclaimed at once, not refused."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        ticks = _ssd_dir._start_ticks(proc.pid)
        if ticks is None:
            pytest.skip("no /proc/<pid>/stat here")
        os.kill(proc.pid, signal.SIGKILL)
        for _ in range(200):  # until the kernel has made it a zombie (not reaped: no wait yet)
            if (_ssd_dir._stat_fields(proc.pid) or ["?"])[0] == "Z":
                break
            time.sleep(0.01)
        rank_dir = _job_dir(tmp_path, pid=proc.pid, start_ticks=ticks, boot_id=_ssd_dir._boot_id())
        said = []
        _ssd_dir.SSDDir.claim(tmp_path / "ssd", 0, 1, log=said.append).release()
        assert len(said) == 1 and f"process {proc.pid} has exited" in said[0]
        assert _tree(rank_dir) == []
    finally:
        proc.kill()
        proc.wait()


def test_a_job_that_may_still_run_is_refused(tmp_path, other_program):
    """Its pid runs and started when JOB says (or JOB predates start times): refused, as today."""
    for extra in ({"start_ticks": _ssd_dir._start_ticks(other_program)}, {}):
        rank_dir = _job_dir(tmp_path, pid=other_program, **extra)
        before = _tree(rank_dir)
        with pytest.raises(InvalidInputError, match="whose process may still run"):
            _ssd_dir.SSDDir.claim(tmp_path / "ssd", 0, 1)
        assert _tree(rank_dir) == before
        shutil.rmtree(tmp_path / "ssd")


def test_a_restart_of_the_machine_ends_every_job(tmp_path, other_program):
    rank_dir = _job_dir(tmp_path, pid=other_program, start_ticks=_ssd_dir._start_ticks(other_program),
                        boot_id="another-boot")
    if _ssd_dir._boot_id() is None:
        pytest.skip("no boot id here")
    said = []
    _ssd_dir.SSDDir.claim(tmp_path / "ssd", 0, 1, log=said.append).release()
    assert "the machine was restarted since" in said[0] and _tree(rank_dir) == []


def test_a_job_file_of_another_host_is_refused_saying_so(tmp_path):
    rank_dir = _job_dir(tmp_path, pid=2 ** 22 + 7, host="elsewhere")  # no such pid here: still not ours to judge
    before = _tree(rank_dir)
    with pytest.raises(InvalidInputError, match="of a job on another host .*pid 4194311 on elsewhere.*cannot be told"):
        _ssd_dir.SSDDir.claim(tmp_path / "ssd", 0, 1)
    assert _tree(rank_dir) == before
