"""One MPI rank's command under a clock: ``python -m bench.rank_time OUT CORES -- CMD...``.

Runs CMD as a child, first pinned to its own ``CORES`` CPUs when ``CORES`` > 0 (rank r gets CPUs
r*CORES .. r*CORES+CORES-1 of this process's affinity set; the rank comes from MPICH's ``PMI_RANK`` or
Open MPI's ``OMPI_COMM_WORLD_RANK``), and writes ``wall user sys max_rss_kib`` of the child to
``OUT.<rank>`` -- what ``/usr/bin/time -f "%e %U %S %M"`` writes, without needing it installed (the GPU
machines' image lacks it). Exits with the child's status.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time


def rank() -> int:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def pin(r: int, cores: int) -> list[int]:
    """Pin this process (and so its child) to rank ``r``'s ``cores`` CPUs -> the CPUs."""
    avail = sorted(os.sched_getaffinity(0))
    mine = avail[r * cores:(r + 1) * cores]
    if len(mine) < cores:
        raise SystemExit(f"rank {r} needs CPUs {r * cores}..{(r + 1) * cores - 1} of {len(avail)} available: "
                         f"run fewer ranks or fewer cores per rank")
    os.sched_setaffinity(0, mine)
    return mine


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        raise SystemExit(__doc__.split("\n\n")[0])
    out, cores, cmd = argv[0], int(argv[1]), argv[3:]
    r = rank()
    if cores > 0:
        pin(r, cores)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, close_fds=False)  # the child inherits the MPI launcher's PMI socket
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(f"{out}.{r}", "w") as f:
        f.write(f"{wall:.3f} {ru.ru_utime:.3f} {ru.ru_stime:.3f} {ru.ru_maxrss}\n")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
