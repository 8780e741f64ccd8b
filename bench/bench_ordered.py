"""The fixed-order dense all-reduce the trainer uses (``hps.comm.ordered_allreduce``: reduce-scatter with a
rank-order fold, then allgather) against MPI's own ``Allreduce``, on one vector size.

Run (one operation per process, so a whole-process timer can pair them)::

    mpiexec -n 4 python -m bench.bench_ordered --op ordered --size 2200000 --iters 200 [--wait yield]
    mpiexec -n 4 python -m bench.bench_ordered --op mpi     --size 2200000 --iters 200 [--wait yield]

Each rank calls the operation ``iters`` times between barriers (after ``warmup`` calls) and rank 0
prints the slowest rank's mean microseconds per call. ``--size`` is the vector's bytes (float32; the
scaling job's 2-layer MLP has a 2.2 MB dense gradient). ``--wait yield`` starts each call non-blocking and
polls it with sleeps, as the trainer's channels do when ranks outnumber cores (``hps.comm.poll``).
"""

from __future__ import annotations

import time

from hps._argparse import ArgumentParser


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m bench.bench_ordered", description=__doc__.split("\n")[0])
    p.add_argument("--op", choices=["ordered", "mpi"], required=True)
    p.add_argument("--size", type=int, default=2_200_000, help="vector bytes (float32)")
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--wait", choices=["spin", "yield"], default="spin")
    a = p.parse_args(argv)

    import numpy as np
    from mpi4py import MPI

    from hps.comm import ordered_allreduce, poll

    comm = MPI.COMM_WORLD
    vec = np.random.default_rng(comm.Get_rank()).standard_normal(a.size // 4).astype(np.float32)
    work = np.empty_like(vec)

    def run(blocking, nonblocking):
        if a.wait == "spin":
            blocking()
        else:
            poll(nonblocking())

    def ordered():
        work[...] = vec
        ordered_allreduce(comm, work, run)

    def mpi():
        work[...] = vec
        run(lambda: comm.Allreduce(MPI.IN_PLACE, work, op=MPI.SUM),
            lambda: comm.Iallreduce(MPI.IN_PLACE, work, op=MPI.SUM))

    fn = ordered if a.op == "ordered" else mpi
    for _ in range(a.warmup):
        fn()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(a.iters):
        fn()
    dt = comm.allreduce((time.perf_counter() - t0) / a.iters, op=MPI.MAX)
    if comm.Get_rank() == 0:
        print(f"{a.op} {a.wait} {comm.Get_size()} ranks {a.size} B: {dt * 1e6:.1f} us per call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
