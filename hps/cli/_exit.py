"""The exit codes and error lines every hps command shares: 0 done, 2 bad input (``InvalidInputError``,
``InvalidTypeError``), 1 failure; an error is one line on stderr, ``hps: error: <message>``, and
under MPI ``hps: rank R of N failed: …`` before the job is aborted."""

from __future__ import annotations

from ..errors import InvalidInputError, InvalidTypeError

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def is_bad_input(e: BaseException) -> bool:
    cause = e.__cause__ if getattr(e, "stage", None) else None
    bad = (InvalidInputError, InvalidTypeError)
    return isinstance(e, bad) or isinstance(cause, bad)


def fail(comm, e: BaseException, code: int) -> int:
    from ..comm._failure import abort, failure_message, write_line

    if comm is not None and comm.Get_size() > 1:
        write_line(failure_message(comm, e))
        abort(comm, code)
        return code
    write_line(f"hps: error: {e}")
    return code
