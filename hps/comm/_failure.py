"""Fail fast: a rank that fails takes the whole job down, naming itself, instead of leaving peers hung.

Two ways a rank can fail:

* **It raises.** Wrap the rank's work in :func:`abort_on_error` / :func:`run_guarded` (or call
  :func:`install_excepthook` once): the error is printed to stderr as
  ``hps: rank R of N failed: <Type>: <message>`` (plus the traceback) and ``comm.Abort(1)`` kills every
  process of the job, including ranks blocked inside a collective.
* **It is killed** (SIGKILL, OOM killer, segfault). No Python code runs; the process manager notices
  the dead process — MPICH's hydra ``mpiexec`` prints ``BAD TERMINATION ... RANK R ... KILLED BY
  SIGNAL`` and kills the other ranks; Open MPI's ``mpirun`` does the same — so ``mpiexec`` exits
  non-zero and no rank hangs. Nothing needs to be installed for this.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from contextlib import contextmanager

#: Exit code passed to ``MPI_Abort`` when a rank fails.
ABORT_CODE = 1


#: Seconds a failing rank waits between writing its message and ``MPI_Abort``: the abort tears down
#: mpiexec's output forwarding, and a loaded machine could lose the one line that says what failed.
ABORT_GRACE_S = 0.5


def abort(comm, code: int) -> None:
    """Flush stdout/stderr, give mpiexec ``ABORT_GRACE_S`` to forward them, then ``comm.Abort(code)``."""
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    time.sleep(ABORT_GRACE_S)
    comm.Abort(code)


def write_line(line: str, file=None) -> None:
    """Write ``line`` and its newline to ``file`` (stderr) in one write call, then flush: the lines of
    processes sharing one stream (the ranks under mpiexec) stay whole instead of running together."""
    file = sys.stderr if file is None else file
    file.write(line if line.endswith("\n") else line + "\n")
    file.flush()


def failure_message(comm, exc: BaseException) -> str:
    """``hps: rank R of N failed: <Type>: <message>`` for ``exc`` on this rank of ``comm``."""
    return f"hps: rank {comm.Get_rank()} of {comm.Get_size()} failed: {type(exc).__name__}: {exc}"


def abort_job(comm, exc: BaseException, code: int = ABORT_CODE, file=None) -> None:
    """Print the failure message and traceback of ``exc`` to stderr, then ``comm.Abort(code)``.

    Does not return (MPI_Abort terminates every process of ``comm``'s job).
    """
    file = sys.stderr if file is None else file
    try:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        write_line(f"{tb}{failure_message(comm, exc)}", file)
    finally:
        abort(comm, code)


@contextmanager
def abort_on_error(comm, code: int = ABORT_CODE):
    """Context manager: any exception escaping the block aborts the job via :func:`abort_job`.

    ``SystemExit(0)`` / ``SystemExit(None)`` pass through (a clean exit is not a failure).
    """
    try:
        yield
    except SystemExit as e:
        if e.code in (0, None):
            raise
        abort_job(comm, e, code)
    except BaseException as e:  # noqa: BLE001 - KeyboardInterrupt must take the job down too
        abort_job(comm, e, code)


def run_guarded(comm, fn, *args, **kwargs):
    """Return ``fn(*args, **kwargs)``; if it raises, abort the job naming this rank and the error."""
    with abort_on_error(comm):
        return fn(*args, **kwargs)


def install_excepthook(comm, code: int = ABORT_CODE) -> None:
    """Make uncaught exceptions — in the main thread and in any thread — abort the job.

    For pipeline threads: an error in a stage thread would otherwise leave the main thread waiting in a
    collective forever. Process-wide (replaces ``sys.excepthook`` and ``threading.excepthook``).
    """

    def hook(exc_type, exc, tb):
        if exc is None:
            exc = exc_type()
        abort_job(comm, exc.with_traceback(tb), code)

    def thread_hook(args):
        if args.exc_type is SystemExit:
            return
        exc = args.exc_value if args.exc_value is not None else args.exc_type()
        abort_job(comm, exc, code)

    sys.excepthook = hook
    threading.excepthook = thread_hook
