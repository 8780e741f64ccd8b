"""Ctrl-C and SIGTERM during a run: the pipeline stops, the job's temporary SSD-PS is removed, the
last checkpoint and how to resume are named, and the exit code is 128 + the signal — in one
process and under ``mpiexec`` (which forwards both signals to every rank)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from hps.config import Config
from hps.train._main import _resume_hint

# long enough that no run can finish before the first checkpoint plus a signal
ARGS = ["--rows", "2000000", "--fields", "4", "--vocab-per-field", "3000", "--batch-size", "2048",
        "--minibatch-size", "256", "--hidden", "16,8", "--embedding-dim", "8", "--no-progress",
        "--checkpoint-every", "2"]


def _default_signals():
    """A job started from a background shell inherits SIGINT ignored (POSIX), and Python then installs
    no KeyboardInterrupt handler: give the job the disposition an interactive Ctrl-C meets."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt(tmp_path, sig, launcher=()):
    """Start a job with a private TMPDIR, send ``sig`` once its first checkpoint exists
    -> (process, stderr, TMPDIR, checkpoint dir)."""
    tmp, ck = tmp_path / "tmp", tmp_path / "ck"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.Popen([*launcher, sys.executable, "-m", "hps.train", *ARGS, "--checkpoint-dir", str(ck)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_signals)
    deadline = time.time() + 240
    while not (ck / "LATEST").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the job ended before it was interrupted: {proc.communicate()[1][-2000:]}"
    assert list(tmp.glob("hps-ssd-*")), "the job's temporary SSD-PS should exist while it runs"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=180)
    return proc, err, tmp, ck


def _check(proc, err, tmp, ck, sig):
    assert proc.returncode == 128 + sig, err[-3000:]
    assert f"interrupted by {signal.Signals(sig).name}" in err
    assert f"--resume --checkpoint-dir {ck}" in err
    assert err.count("The last checkpoint is") == 1  # rank 0 speaks for the job
    last = (ck / "LATEST").read_text().strip()
    assert f"The last checkpoint is {ck / last}" in err
    assert "Traceback" not in err and "pipeline stage" not in err
    assert list(tmp.iterdir()) == [], "the job left files in its TMPDIR"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_job_cleans_up_and_says_how_to_resume(tmp_path, sig):
    _check(*_interrupt(tmp_path, sig), sig)


@pytest.mark.mpi
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_mpiexec_ends_every_rank_cleanly(mpiexec, tmp_path, sig):
    proc, err, tmp, ck = _interrupt(tmp_path, sig, launcher=(mpiexec, "-n", "2"))
    _check(proc, err, tmp, ck, sig)
    assert "rank 1 of 2 failed" not in err and "Abort" not in err


def test_the_resume_hint_says_what_exists(tmp_path):
    assert "no --checkpoint-dir" in _resume_hint(Config())
    ck = tmp_path / "ck"
    assert f"No checkpoint was completed in {ck}" in _resume_hint(Config.from_flat({"checkpoint_dir": str(ck)}))
    assert "No checkpoint was written" in _resume_hint(None)  # interrupted before the flags were read


def test_a_failing_start_leaves_no_temporary_directory(tmp_path):
    """The trainer fails after making its temporary SSD-PS (a budget too small for one batch): gone."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "hps.train", *ARGS, "--mem-budget", "1MB"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "cannot hold one batch's working set" in proc.stderr
    assert list(tmp_path.iterdir()) == []
