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
   (:func:`space_error`); nothing acknowledged is lost.

Thread safety: :func:`switch_manifest` takes the catalog's ``changing()`` lock itself; callers hold
their own serialising lock (``_dump_mu`` or ``Compactor.lock``) before it, never the catalog's lock.
"""

from __future__ import annotations

import errno

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
