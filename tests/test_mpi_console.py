"""What a user of ``mpiexec -n 2`` sees: every rank's error is a whole line of its own, and Ctrl-C stops
the job in about a second and leaves no rank behind, even when the ranks were stopped a few
collectives apart (one rank's stage threads then wait in collectives their stopped peers never join)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_interrupt import ARGS, _default_signals



class _Comm:
    """Rank 1 of 2, recording the code MPI_Abort was called with."""

    def Get_rank(self):
        return 1

    def Get_size(self):
        return 2

    def Abort(self, code):
        self.aborted = code


class _Stream:
    """A stream that records each write call."""

    def __init__(self):
        self.writes = []

    def write(self, text):
        self.writes.append(text)

    def flush(self):
        pass


def _ranks_of(marker: str) -> dict[int, int]:
    """{rank: pid} of the hps.train processes whose command line holds ``marker``."""
    out = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if b"hps.train" in cmd and marker.encode() in cmd and b"PMI_RANK" in env:
            out[int(env[b"PMI_RANK"])] = int(proc.name)
    return out


def test_a_ranks_error_is_written_whole_in_one_call(monkeypatch):
    """print() writes the message and its newline in two calls, between which another rank's line
    could land (under mpiexec the two ranks' lines ran together about half the time)."""
    from hps.comm import _failure
    from hps.errors import InvalidInputError
    from hps.cli import EXIT_BAD_INPUT
    from hps.cli import fail as _fail

    err, comm = _Stream(), _Comm()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(_failure, "ABORT_GRACE_S", 0.0)
    assert _fail(comm, InvalidInputError("data file not found: x.csv"), EXIT_BAD_INPUT) == EXIT_BAD_INPUT
    assert err.writes == ["hps: rank 1 of 2 failed: InvalidInputError: data file not found: x.csv\n"]
    assert comm.aborted == EXIT_BAD_INPUT
    err.writes.clear()
    _fail(None, InvalidInputError("bad"), EXIT_BAD_INPUT)  # one process: no rank named
    assert err.writes == ["hps: error: bad\n"]


@pytest.mark.mpi
def test_each_ranks_error_is_a_line_of_its_own(mpiexec, tmp_path):
    """Both ranks fail at once, on the same missing file: two whole lines, never run together."""
    for _ in range(3):
        proc = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "hps.train", "--format", "csv", "--data",
                               "nope.csv"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode != 0
        lines = [line for line in proc.stderr.splitlines() if line.startswith("hps:") or "hps:" in line]
        assert sorted(lines) == [f"hps: rank {r} of 2 failed: DataFileNotFoundError: data file not found: nope.csv"
                                 for r in (0, 1)], proc.stderr


@pytest.mark.mpi
def test_ctrl_c_stops_every_rank_within_seconds(mpiexec, tmp_path):
    """Rank 1 is interrupted first, the whole process group (a terminal's Ctrl-C) 0.3 s later: rank 0's
    threads, still training meanwhile, are left in collectives rank 1 never joins. The job still ends
    in about a second (it took 10 s, the pipeline's stop timeout), says where to resume, and every rank
    is gone."""
    ck = tmp_path / "ck"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "hps.train", *ARGS, "--checkpoint-dir",
                             str(ck)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=_default_signals)
    try:
        deadline = time.time() + 240
        while not (ck / "LATEST").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        ranks = _ranks_of(str(ck))
        assert sorted(ranks) == [0, 1]
        os.kill(ranks[1], signal.SIGINT)
        time.sleep(0.3)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert "hps: interrupted by SIGINT" in err and f"--resume --checkpoint-dir {ck}" in err
    assert "failed" not in err and "Traceback" not in err, err[-3000:]
    assert took < 4.0, f"the job took {took:.1f} s to stop"
    time.sleep(0.2)
    assert _ranks_of(str(ck)) == {}, "a rank outlived mpiexec"
