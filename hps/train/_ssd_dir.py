"""The SSD-PS directory of one rank of a job: claimed for this job alone, removed at its end.

Layout under ``--ssd-path ROOT`` (a temporary directory without it)::

    ROOT/rank{r}-of-{n}/        this rank's directory, claimed by this job
        JOB                     flock'ed while the job runs; JSON: pid, host, start time, keep
        store/                  the SSD-PS (hps.ssd.SSDStore), scratch space of this run

hps never deletes what it did not create:

- ``ROOT`` may hold anything else; it is created when missing.
- ``rank{r}-of-{n}`` must be missing or empty. Its ``JOB`` file is created exclusively
  (``O_EXCL``) and locked: a second job on the same path finds it and gets
  :class:`~hps.errors.StoreLockedError` naming the job that holds it (pid, host), or, when that job
  is gone (kept with ``--keep-ssd``, or killed), :class:`~hps.errors.InvalidInputError` saying so.
  Any other content is foreign: InvalidInputError, and nothing is touched.
- At the end, unless the job keeps its store: ``store/`` (created by this job), ``JOB``, then the
  directories this rank created (``rank{r}-of-{n}``, ``ROOT`` when it made it), each only if empty.

Not thread-safe: one SSDDir per rank, owned by the trainer.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None

from ..errors import InvalidInputError, StoreLockedError

#: Name of the job file in a rank directory. Written to disk: never rename.
JOB_FILE = "JOB"
#: Name of the SSD-PS directory beside it. Written to disk: never rename.
STORE_DIR = "store"


class SSDDir:
    """``SSDDir.claim(root, rank, size, keep)``: ``store_path`` is where this rank's SSD-PS goes;
    ``release()`` removes what the claim created (unless ``keep``) -> the kept path, or None."""

    def __init__(self, rank_dir: Path, fd: int, made: list[Path], keep: bool):
        self.rank_dir, self._fd, self._made, self.keep = rank_dir, fd, made, keep
        self.store_path = rank_dir / STORE_DIR

    @classmethod
    def claim(cls, root, rank: int, size: int, keep: bool = False) -> "SSDDir":
        """Claim ``root/rank{rank}-of-{size}`` (``root`` None: a new temporary directory). Raises
        InvalidInputError (unwritable root, foreign files, a store left by an earlier job) or
        StoreLockedError (another running job holds it); nothing existing is changed then."""
        made = []
        if root is None:
            try:
                root = Path(tempfile.mkdtemp(prefix="hps-ssd-"))
            except OSError as e:
                raise InvalidInputError(f"cannot create a temporary SSD-PS directory in {tempfile.gettempdir()}: "
                                        f"{e.strerror or e}; give --ssd-path DIR or set TMPDIR") from e
            made.append(root)
        else:
            root = Path(root)
            made += _makedirs(root, probe=True)
        rank_dir = root / f"rank{rank}-of-{size}"
        try:
            made += _makedirs(rank_dir, probe=False)
            fd = _create_job_file(rank_dir, keep)
        except BaseException:
            _remove_empty(made)
            raise
        foreign = sorted(set(os.listdir(rank_dir)) - {JOB_FILE})
        if foreign:  # take back only the JOB file: everything else here is someone else's
            _drop_job(rank_dir, fd)
            _remove_empty(made)
            raise InvalidInputError(
                f"--ssd-path: {rank_dir} holds files hps did not create ({', '.join(foreign[:3])}"
                f"{', ...' if len(foreign) > 3 else ''}); hps never deletes them: choose another --ssd-path")
        return cls(rank_dir, fd, made, keep)

    def release(self) -> Path | None:
        """Unlock; unless ``keep``, remove the store, the JOB file and the directories the claim made
        (each only when empty) -> the kept store's path, or None. Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return None
        if self.keep:
            _unlock(fd)
            return self.store_path
        # made by this job: the claim found the rank directory empty but for its own JOB file
        shutil.rmtree(self.store_path, ignore_errors=True)
        _drop_job(self.rank_dir, fd)
        _remove_empty(self._made)
        return None


def _makedirs(path: Path, probe: bool) -> list[Path]:
    """Create ``path`` and missing parents -> the directories created, deepest last. ``probe``: check
    that a file can be created in it (a temporary one, removed at once)."""
    missing = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    made = []
    try:
        for d in reversed(missing):
            try:
                d.mkdir()
                made.append(d)
            except FileExistsError:
                pass
        if not path.is_dir():
            _remove_empty(made)
            raise InvalidInputError(f"--ssd-path {path} is not a writable directory: exists and is not a directory")
        if probe:
            tempfile.NamedTemporaryFile(dir=path, prefix=".hps-probe-").close()
    except OSError as e:
        _remove_empty(made)
        raise InvalidInputError(f"--ssd-path {path} is not a writable directory: {e.strerror or e}") from e
    return made


def _create_job_file(rank_dir: Path, keep: bool) -> int:
    """Create and lock ``rank_dir/JOB`` for this job -> its descriptor (held until release)."""
    path = rank_dir / JOB_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise _taken(rank_dir) from None
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), "keep": bool(keep)}
        os.write(fd, json.dumps(info).encode())
    except BaseException:
        os.close(fd)
        os.remove(path)
        raise
    return fd


def _taken(rank_dir: Path) -> Exception:
    """The error for a rank directory whose JOB file exists: held by a running job, or left behind."""
    path = rank_dir / JOB_FILE
    try:
        info = json.loads(path.read_text())
        who = f"pid {info['pid']} on {info['host']}, started {info['started']}"
        kept = bool(info.get("keep"))
    except (OSError, ValueError, KeyError, TypeError):
        who, kept = "unknown job", False
    held = False
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            fd = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                held = True
            finally:
                os.close(fd)
    if held:
        return StoreLockedError(f"--ssd-path: {rank_dir} is in use by another job ({who}); give each "
                                "job its own --ssd-path")
    why = "kept with --keep-ssd" if kept else "left behind by a job that did not finish"
    return InvalidInputError(f"--ssd-path: {rank_dir} holds the SSD-PS of an earlier job ({who}; {why}); "
                             "hps does not delete it: remove it yourself or choose another --ssd-path")


def _unlock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _drop_job(rank_dir: Path, fd: int) -> None:
    """Remove this job's JOB file, then release its lock."""
    try:
        os.remove(rank_dir / JOB_FILE)
    except FileNotFoundError:
        pass
    _unlock(fd)


def _remove_empty(dirs) -> None:
    """rmdir each of ``dirs``, deepest first; a directory that is not empty (or gone) stays as it is."""
    for d in sorted(dirs, key=lambda p: len(p.parts), reverse=True):
        try:
            os.rmdir(d)
        except OSError:
            pass
