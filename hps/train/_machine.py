"""What memory this process may use, read from the system: the container's limit and the machine's.

- ``memory_limit()``: the hard bound — physical memory, or the cgroup limit when lower (v2
  ``memory.max``, v1 ``memory.limit_in_bytes``). A job asking for more is refused.
- ``memory_available()``: what is free for a new job now — ``MemAvailable`` of ``/proc/meminfo``, or
  the cgroup limit less what the cgroup uses, when lower. The default budget is a share of it.

Each returns ``(bytes, where it came from)``, or ``(None, reason)`` when the system does not say.
The paths are module constants so tests can point them at fixtures.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where cgroup v2 and v1 mount their memory controller, this process's cgroup paths, and meminfo.
CGROUP_V2_ROOT = Path("/sys/fs/cgroup")
CGROUP_V1_ROOT = Path("/sys/fs/cgroup/memory")
PROC_CGROUP = Path("/proc/self/cgroup")
PROC_MEMINFO = Path("/proc/meminfo")
#: A cgroup limit at or above this is "no limit" (v1 writes 2**63 rounded down to a page).
_UNLIMITED = 1 << 60


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_dirs() -> list[tuple[Path, str, str]]:
    """(directory, limit file, usage file) of this process's cgroups that may hold a memory limit:
    its own cgroup's directory under each hierarchy, and the mount's root (inside a container the
    root is the container's cgroup)."""
    out = []
    try:
        lines = PROC_CGROUP.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, rel = (line.split(":", 2) + ["", ""])[:3]
        rel = rel.strip().lstrip("/")
        if controllers == "":
            out.append((CGROUP_V2_ROOT / rel, "memory.max", "memory.current"))
        elif "memory" in controllers.split(","):
            out.append((CGROUP_V1_ROOT / rel, "memory.limit_in_bytes", "memory.usage_in_bytes"))
    out += [(CGROUP_V2_ROOT, "memory.max", "memory.current"),
            (CGROUP_V1_ROOT, "memory.limit_in_bytes", "memory.usage_in_bytes")]
    return out


def cgroup_limit() -> tuple[int, int | None, str] | None:
    """(limit, usage or None, name of the limit file) of the tightest cgroup memory limit, or None."""
    best = None
    for d, limit_file, usage_file in _cgroup_dirs():
        limit = _read_int(d / limit_file)
        if limit is None or limit >= _UNLIMITED:
            continue
        if best is None or limit < best[0]:
            best = (limit, _read_int(d / usage_file), f"cgroup {limit_file}")
    return best


def _meminfo(field: str) -> int | None:
    try:
        for line in PROC_MEMINFO.read_text().splitlines():
            name, _, rest = line.partition(":")
            if name == field:
                return int(rest.split()[0]) * 1024   # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_limit() -> tuple[int | None, str]:
    """The most memory this process may hold: physical memory, or its cgroup's limit when lower."""
    try:
        total, what = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "physical memory"
    except (AttributeError, ValueError, OSError):
        total, what = None, "physical memory unknown"
    cg = cgroup_limit()
    if cg is not None and (total is None or cg[0] < total):
        return cg[0], cg[2]
    return total, what


def memory_available() -> tuple[int | None, str]:
    """Memory free for a new job now: MemAvailable, or the cgroup limit less its usage when lower."""
    avail, what = _meminfo("MemAvailable"), "MemAvailable"
    cg = cgroup_limit()
    if cg is not None:
        free = cg[0] - (cg[1] or 0)
        if avail is None or free < avail:
            avail, what = free, (f"{cg[2]} less its usage" if cg[1] is not None else cg[2])
    if avail is None:
        return None, "the system reports neither MemAvailable nor a cgroup limit"
    return max(0, avail), what
