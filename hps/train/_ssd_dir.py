"""The SSD-PS directory of one rank of a job: claimed for this job alone, removed at its end.

Layout under ``--ssd-path ROOT`` (a temporary directory without it)::

    ROOT/rank{r}-of-{n}/        this rank's directory, claimed by this job
        JOB                     flock'ed while the job runs; JSON: pid, host, start time, keep, the
                                directories the job made, and what identifies the process on its
                                host (boot id, process start time)
        store/                  the SSD-PS (hps.ssd.SSDStore), scratch space of this run

hps never deletes what it did not create:

- ``ROOT`` may hold anything else; it is created when missing.
- ``rank{r}-of-{n}`` must be missing or empty. Its ``JOB`` file is created exclusively
  (``O_EXCL``) and locked. A second job on the same path finds it:

  - locked: the job runs. :class:`~hps.errors.StoreLockedError` naming it (pid, host).
  - made on this host by a job that provably died (``kill -9``, a crash, a reboot): its pid is gone or has
    exited (a zombie its parent has not reaped yet), the machine booted since, or the pid is now another
    program (its start time differs from the one in ``JOB``). The new job **reclaims** the directory —
    under the old ``JOB``'s lock, so two jobs cannot both — removing the SSD-PS's own files (``hps.ssd``'s
    ``is_store_file``: named by its format), ``store/`` and ``JOB``, and says so in one line. Only if
    everything there is hps's: a file or directory of another name means someone else wrote there, so
    nothing is removed and the job is refused (InvalidInputError naming what is foreign).
  - kept with ``--keep-ssd``, made on another host (whether that job runs cannot be told from
    here), or of a process that may still run: InvalidInputError saying which, nothing touched.

  Any other content of a directory without ``JOB`` is foreign: InvalidInputError, nothing touched.
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
from ..ssd._format import is_store_file

#: Name of the job file in a rank directory. Written to disk: never rename.
JOB_FILE = "JOB"
#: Name of the SSD-PS directory beside it. Written to disk: never rename.
STORE_DIR = "store"
#: The Linux boot id (changes at every boot) and the process table with start times.
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
_PROC = Path("/proc")


class SSDDir:
    """``SSDDir.claim(root, rank, size, keep)``: ``store_path`` is where this rank's SSD-PS goes;
    ``release()`` removes what the claim created (unless ``keep``) -> the kept path, or None."""

    def __init__(self, rank_dir: Path, fd: int, made: list[Path], keep: bool):
        self.rank_dir, self._fd, self._made, self.keep = rank_dir, fd, made, keep
        self.store_path = rank_dir / STORE_DIR

    @classmethod
    def claim(cls, root, rank: int, size: int, keep: bool = False, log=None) -> "SSDDir":
        """Claim ``root/rank{rank}-of-{size}`` (``root`` None: a new temporary directory), reclaiming
        it from a job that died there (see the module docstring; ``log(line)`` hears of it). Raises
        InvalidInputError (unwritable root, foreign files, a store kept or of a job that may run)
        or StoreLockedError (another running job holds it); nothing existing is changed then."""
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
            fd = _create_job_file(rank_dir, keep, rank, size, made, log)
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


def _create_job_file(rank_dir: Path, keep: bool, rank: int, size: int, made: list, log=None) -> int:
    """Create and lock ``rank_dir/JOB`` for this job (reclaiming the directory from a dead job
    first, whose directories it adopts into ``made``) -> its descriptor (held until release)."""
    path = rank_dir / JOB_FILE
    for _ in range(3):  # a reclaim, then the claim; another job may be doing the same at once
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            break
        except FileExistsError:
            note, adopted = _reclaim(rank_dir)
            made += [d for d in adopted if d not in made]
            if note and log is not None:
                log(f"hps: {f'rank {rank} of {size}: ' if size > 1 else ''}{note}")
    else:
        raise _taken(rank_dir)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), "keep": bool(keep),
                "boot_id": _boot_id(), "start_ticks": _start_ticks(os.getpid()),
                "made": [str(d) for d in made]}
        os.write(fd, json.dumps(info).encode())
    except BaseException:
        os.close(fd)
        os.remove(path)
        raise
    return fd


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return None


def _stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after "pid (comm)" (field 3, the state, first), or None."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
        return stat[stat.rindex(")") + 2:].split()
    except (OSError, ValueError):
        return None


def _start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, /proc/<pid>/stat field 22), or None."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None


def _gone(info: dict) -> str | None:
    """Why the job of JOB ``info`` (made on this host) provably no longer runs, or None."""
    pid = info.get("pid")
    if not isinstance(pid, int):
        return None
    if info.get("boot_id") and _boot_id() and info["boot_id"] != _boot_id():
        return "the machine was restarted since"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"process {pid} is gone"
    except PermissionError:
        pass  # it exists, another user's
    fields = _stat_fields(pid)
    if fields and fields[0] in ("Z", "X"):  # killed, not yet reaped by its parent: it runs no more
        return f"process {pid} has exited"
    ticks = info.get("start_ticks")
    if ticks is not None and _start_ticks(pid) not in (None, ticks):
        return f"process {pid} is now another program"
    return None


def _reclaim(rank_dir: Path) -> tuple[str | None, list[Path]]:
    """Take ``rank_dir`` back from the dead job whose JOB file is there (module docstring): remove
    its store and JOB -> (the line to say, the directories that job made: ``rank_dir`` and its
    parents), or (None, []) when JOB vanished meanwhile (try again). Raises the error of
    :func:`_taken`, or InvalidInputError naming foreign files; nothing is touched then."""
    path = rank_dir / JOB_FILE
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None, []
    try:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: the job runs (or another job reclaims it now)
                raise _taken(rank_dir, held=True) from None
        try:
            if os.fstat(fd).st_ino != os.stat(path).st_ino:
                return None, []  # reclaimed and claimed by another job meanwhile: look again
        except FileNotFoundError:
            return None, []
        info = _read_job(fd)
        why = None if info is None or info.get("keep") or info.get("host") != socket.gethostname() else _gone(info)
        if why is None:
            raise _taken(rank_dir, info, held=False)
        store = rank_dir / STORE_DIR
        names = sorted(set(os.listdir(rank_dir)) - {JOB_FILE, STORE_DIR})
        mine = store.is_dir() and not store.is_symlink()
        files = sorted(os.listdir(store)) if mine else []
        names += [f"{STORE_DIR}/{n}" for n in files
                  if not is_store_file(n) or not (store / n).is_file() or (store / n).is_symlink()]
        if os.path.lexists(store) and not mine:
            names.append(STORE_DIR)
        if names:
            raise InvalidInputError(
                f"--ssd-path: {rank_dir} holds the SSD-PS of an earlier job ({_who(info)}; {why}) and files hps "
                f"did not create ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}); hps removes "
                "only its own files and left everything as it was: move those away (hps then reclaims the "
                "rest) or choose another --ssd-path")
        for n in files:
            os.remove(store / n)
        if mine:
            os.rmdir(store)
        os.remove(path)
        made = [Path(d) for d in info.get("made", ()) if isinstance(d, str)]
        adopted = [d for d in made if d == rank_dir or d in rank_dir.parents]
        return (f"reclaimed --ssd-path {rank_dir} from an earlier job that did not finish ({_who(info)}; "
                f"{why}): removed its SSD-PS ({len(files)} files)"), adopted
    finally:
        os.close(fd)  # releases the lock


def _read_job(fd: int) -> dict | None:
    """The JSON of an open JOB file, or None when it is unreadable."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 1 << 16).decode())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _who(info: dict | None) -> str:
    try:
        return f"pid {info['pid']} on {info['host']}, started {info['started']}"
    except (KeyError, TypeError):
        return "unknown job"


def _taken(rank_dir: Path, info: dict | None = None, held: bool | None = None) -> Exception:
    """The error for a rank directory whose JOB file exists and is not reclaimed: held by a running
    job, kept, made on another host, or of a job that may still run. ``info``: its JOB, if read;
    ``held``: whether its lock is held (None: find out)."""
    path = rank_dir / JOB_FILE
    if info is None:
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError):
            info = None
    info = info if isinstance(info, dict) else {}
    who = _who(info)
    if held is None:
        held = _lock_held(path)
    if held:
        return StoreLockedError(f"--ssd-path: {rank_dir} is in use by another job ({who}); give each "
                                "job its own --ssd-path")
    if not info.get("keep") and info.get("host", socket.gethostname()) != socket.gethostname():
        return InvalidInputError(f"--ssd-path: {rank_dir} holds the SSD-PS of a job on another host ({who}): "
                                 "whether it still runs cannot be told from here, and hps does not delete it: "
                                 "if that job is over, remove the directory yourself; else choose another --ssd-path")
    why = ("kept with --keep-ssd" if info.get("keep") else
           "left behind by a job that did not finish, whose process may still run" if info else
           "its JOB file is unreadable")
    return InvalidInputError(f"--ssd-path: {rank_dir} holds the SSD-PS of an earlier job ({who}; {why}); "
                             "hps does not delete it: remove it yourself or choose another --ssd-path")


def _lock_held(path: Path) -> bool:
    """Whether another open file holds the flock of ``path`` (False without flock)."""
    if fcntl is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


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
