"""Ranks pinned to CPUs of their own count every CPU of the node (``hps.comm.node_share``): 2 ranks on one
CPU each are not oversubscribed (the wait mode spins, each rank gets its core), 2 ranks on the same CPU are.
Run as ``mpiexec -n 2`` on a machine with at least 2 CPUs (tests/test_comm.py)."""

import os

from mpi4py import MPI

from hps.comm import node_share, resolve_wait_mode
from hps.train._collectives import Collectives

world = MPI.COMM_WORLD
r, n = world.Get_rank(), world.Get_size()
cpus = sorted(os.sched_getaffinity(0))
assert len(cpus) >= n, f"needs {n} CPUs, has {len(cpus)}"

os.sched_setaffinity(0, {cpus[r]})  # a CPU of its own: the ranks together have n
assert node_share(world) == (n, n), node_share(world)
assert resolve_wait_mode(world, "auto") == "spin"
c = Collectives(world)
assert (c.cores_per_rank, c.ranks_on_node, c.wait_mode) == (1, n, "spin"), (c.cores_per_rank, c.wait_mode)

os.sched_setaffinity(0, {cpus[0]})  # all on one CPU: oversubscribed
assert node_share(world) == (n, 1), node_share(world)
assert resolve_wait_mode(world, "auto") == "yield"
world.Barrier()
if r == 0:
    print(f"pinned_share: OK on {n} ranks")
