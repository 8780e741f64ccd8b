"""``python -m hps.train``: the job from the command line (its parser: ``hps.cli``). Errors become one
line on stderr and exit code 2 (bad input) or 1; an interrupt (Ctrl-C, SIGTERM) exits 130 / 143 after
saying where the last checkpoint is.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from ..cli import EXIT_BAD_INPUT, EXIT_FAILED, fail, is_bad_input, parse_config
from ..comm._mpi import ask_mpich_settings, load_mpi
from ..errors import HpsError
from ..formats import last_checkpoint


def _mpi_launched() -> bool:
    return any(int(os.environ.get(v, "1")) > 1 for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"))


class _Terminated(KeyboardInterrupt):
    """SIGTERM (what schedulers send), raised in the main thread so it unwinds like Ctrl-C."""


def _stop(signum, frame):
    """SIGINT / SIGTERM handler: stop the job by raising in the main thread; from then on both signals
    are ignored, so the job's clean-up runs to its end. (A terminal's Ctrl-C reaches each rank of
    ``mpiexec`` twice: from the terminal, and forwarded by mpiexec.)"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def main(argv=None) -> int:
    """Run the job; returns the exit code. Under MPI a failing rank prints
    ``hps: rank R of N failed: <Type>: <message>`` and aborts the whole job (no rank hangs).

    Ctrl-C (SIGINT) and SIGTERM stop the pipeline, remove the temporary SSD-PS, say where the last
    checkpoint is and exit 130 / 143 (128 + the signal). ``mpiexec`` forwards both signals to every
    rank: each rank cleans up, the ranks wait for each other (a bounded wait) and all exit."""
    comm, cfg = None, None
    in_main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
    for sig, handler in previous.items():
        if handler is not signal.SIG_IGN or sig == signal.SIGTERM:  # a background job ignores SIGINT
            signal.signal(sig, _stop)
    try:
        cfg = parse_config(argv)
        if _mpi_launched():
            ask_mpich_settings()  # before MPI_Init
            comm = load_mpi().COMM_WORLD
        from ._run import run

        run(cfg, comm=comm, on_fatal=(lambda e: _abort(comm, e)) if comm is not None else None)
        return 0
    except KeyboardInterrupt as e:
        return _interrupted(comm, cfg, signal.SIGTERM if isinstance(e, _Terminated) else signal.SIGINT)
    except (HpsError, OSError) as e:
        return fail(comm, e, EXIT_BAD_INPUT if is_bad_input(e) else EXIT_FAILED)
    except Exception as e:
        if comm is not None and comm.Get_size() > 1:
            _abort(comm, e)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


#: Under MPI, how long an interrupted rank waits for the others to finish cleaning up before it
#: aborts the job (a rank that never got the signal would otherwise keep the job alive).
INTERRUPT_SYNC_S = 30.0


def _interrupted(comm, cfg, signum) -> int:
    """Report an interrupt (the job's own files are already removed by ``run``) -> 128 + signum."""
    code = 128 + int(signum)
    if comm is None or comm.Get_rank() == 0:
        from ..comm._failure import write_line

        write_line(f"hps: interrupted by {signal.Signals(signum).name}: training stopped. {_resume_hint(cfg)}")
    if comm is not None and comm.Get_size() > 1:
        _leave_together(comm, code)
    return code


def _resume_hint(cfg) -> str:
    ck = cfg.train.checkpoint_dir if cfg is not None else None
    if not ck:
        return "No checkpoint was written (no --checkpoint-dir): a new run starts from the beginning."
    last = last_checkpoint(ck)
    if last is None:
        return f"No checkpoint was completed in {ck} yet: a new run starts from the beginning."
    return (f"The last checkpoint is {last}: to continue, run the same command with "
            f"--resume --checkpoint-dir {ck}")


def _leave_together(comm, code: int) -> None:
    """Every rank has cleaned up: meet the others (non-blocking barrier on ``comm``, which the
    trainer's threads never use: they have their own duplicates) and exit at once, without
    MPI_Finalize, which could wait for ever on a collective a stopped peer never joined. A rank
    that is not there within INTERRUPT_SYNC_S takes the job down with MPI_Abort."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + INTERRUPT_SYNC_S
    while not req.Test():
        if time.monotonic() > deadline:
            comm.Abort(code)
        time.sleep(0.01)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _abort(comm, e: BaseException) -> None:
    """End the whole MPI job for ``e``, naming this rank: one line for hps errors, the traceback for
    anything else (a bug). Also called from a failing pipeline thread (``Trainer(on_fatal=...)``)."""
    if comm.Get_size() < 2:
        return
    cause = e.__cause__ if getattr(e, "stage", None) else e
    if isinstance(cause, (HpsError, OSError)):
        fail(comm, e, EXIT_BAD_INPUT if is_bad_input(e) else EXIT_FAILED)
    else:
        from ..comm import abort_job

        abort_job(comm, e, EXIT_FAILED)
