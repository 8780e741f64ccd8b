"""The output paths a command line names (``--out``, ``--export``, ``--metrics-out`` …): checked before
any work, so a command that could not write its result fails in its first second."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..errors import InvalidInputError


def check_writable(flag: str, path: Path, is_dir: bool) -> None:
    """Raises InvalidInputError naming ``flag``, ``path`` and why, unless ``path`` can be written: a
    directory (created with its parents if missing) or a file (its directory must exist). Whether
    the directory takes a file is tried (a temporary file, removed at once), not judged from its
    mode bits, which say nothing of root, read-only mounts, immutable directories or /proc."""
    if path.exists() and path.is_dir() != is_dir:
        raise InvalidInputError(f"{flag} {path} is a {'file' if is_dir else 'directory'}, not a "
                                f"{'directory' if is_dir else 'file'}")
    if is_dir:
        where = path
        while not where.exists():
            where = where.parent
    else:
        where = path.parent
        if not where.is_dir():
            raise InvalidInputError(f"{flag} {path}: directory {where} does not exist")
    if not where.is_dir():
        raise InvalidInputError(f"{flag} {path}: {where} is not a writable directory")
    try:
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as e:
        raise InvalidInputError(f"{flag} {path}: {where} is not a writable directory ({e.strerror})") from None
