"""How a change of a store's file set becomes durable — the one protocol that ``dump`` and ``delete``
(:mod:`hps.ssd._store`) and compaction (:mod:`hps.ssd._compaction`) all follow (LevelDB's
``VersionSet::LogAndApply``, with the manifest rewritten whole).

1. The new parameter files are written, fsynced and renamed into place (``FileIO.write_param``) and
   the directory fsynced by the caller.
2. :func:`switch_manifest`: under the catalog's ``changing()``, ``MANIFEST`` is replaced by one that
   lists the new file set (write temp, fsync, rename), the directory is fsynced, and the in-memory
   change (``commit``) runs. Until the rename nothing is acknowledged; a failure leaves the old
   manifest, and the caller removes the files it wrote.
3. A full device (``ENOSPC``, ``EDQUOT``) surfaces as :class:`hps.errors.DiskFullError`
   (:func:`space_error`); nothing acknowledged is lost. :func:`publishing` wraps steps 1-3 for every
   caller.

Thread safety: :func:`switch_manifest` takes the catalog's ``changing()`` lock itself; callers hold
their own serialising lock (``_dump_mu`` or ``Compactor.lock``) before it, never the catalog's lock.
"""

from __future__ import annotations

import errno
from contextlib import contextmanager

from ..errors import DiskFullError

_SPACE_ERRNOS = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def switch_manifest(io, cat, add, remove, commit) -> None:
    """Make the file set (with ``add`` entered, ``remove`` left out) the manifest's, then run
    ``commit()`` (the in-memory change) under the catalog's ``changing()``. A failure before the
    manifest's rename changes nothing; after it, ``commit()`` still runs (the manifest on disk may
    list the new files already) and the error propagates. ``io``: FileIO; ``cat``: Catalog. Blocks."""
    with cat.changing():
        io.write_manifest(*cat.manifest(add, remove))
        try:
            io.env.fsync_dir(io.path)
        finally:
            commit()


@contextmanager
def publishing(io, what: str, names):
    """Around the writing of a change's files and its :func:`switch_manifest`: yields ``committed``, a
    list its commit appends to. A failure before the commit removes the files ``names()`` names (none
    of them was acknowledged); one after it leaves them (the manifest may list them). An OSError comes
    out as :func:`space_error` makes it (``what``: the operation, for the message)."""
    committed: list = []
    try:
        yield committed
    except BaseException as e:
        if not committed:
            io.unlink_quietly(names())
        if isinstance(e, OSError):
            raise space_error(e, what) from e
        raise


def space_error(e: OSError, what: str) -> OSError:
    """Turn ENOSPC/EDQUOT into DiskFullError (``what``: the operation, for the message); leave other
    OSErrors as they are."""
    if e.errno in _SPACE_ERRNOS:
        err = DiskFullError(e.errno, f"no space left on the SSD-PS device while {what} "
                                     f"({e.strerror or e}); nothing acknowledged was lost: free space "
                                     "and retry, or point --ssd-path at a larger device")
        err.filename = e.filename
        return err
    return e
