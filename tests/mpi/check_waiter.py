"""Per-rank checks of how hps waits in MPI (``hps.comm.Waiter``); run as
``mpiexec -n N python tests/mpi/check_waiter.py``.

Every schedule of hps.comm (sparse and dense hierarchical all-reduce on several node layouts, the
owner exchange, the allgather baseline) and every collective of the trainer's channels runs once
spinning and once yielding, on communicators that record the name of every MPI method called on
them. The two modes must give the same bits; yielding, no blocking call may be made (the rank would
spin inside MPI); spinning, the blocking calls must be seen (so the recording cannot pass vacuously).
Every failure aborts the whole job (exit code != 0) with ``hps: rank R of N failed: ...`` on stderr.
"""

import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from check_comm import layouts, sparse_input  # noqa: E402  (this directory)
from tests.reference.comm import owner_of, row_of  # noqa: E402

import hps.comm as C  # noqa: E402
from hps.train._collectives import CHANNELS, Collectives  # noqa: E402

D = 3
#: MPI calls that wait inside MPI (MPICH busy-polls in them).
BLOCKING = frozenset({
    "Send", "Ssend", "Rsend", "Bsend", "Recv", "Sendrecv", "Sendrecv_replace", "Probe", "Mprobe",
    "Bcast", "Barrier", "Gather", "Gatherv", "Scatter", "Scatterv", "Allgather", "Allgatherv",
    "Alltoall", "Alltoallv", "Alltoallw", "Reduce", "Allreduce", "Reduce_scatter", "Reduce_scatter_block",
    "Scan", "Exscan", "send", "recv", "sendrecv", "probe", "bcast", "barrier", "gather", "scatter",
    "allgather", "alltoall", "reduce", "allreduce", "scan", "exscan",
})
CALLS = set()


class Recording(MPI.Intracomm):
    """The same communicator (handle shared), recording the names of the MPI methods called on it."""

    def __getattribute__(self, name):
        attr = super().__getattribute__(name)
        if not name[:1].isalpha() or not callable(attr):
            return attr

        def called(*args, **kwargs):
            CALLS.add(name)
            return attr(*args, **kwargs)

        return called


def record(topo):
    """Make every communicator of ``topo`` a recording one."""
    for name in ("comm", "node_comm", "cross_comm"):
        setattr(topo, name, Recording(getattr(topo, name)))
    topo.leader_comm = topo.cross_comm if topo.is_leader else None


def run_schedules(comm, mode):
    """Every hps.comm schedule over ``comm`` waiting in ``mode`` -> (results, names of the calls made)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    out = []
    CALLS.clear()
    for rpn, node_ids in layouts(size):
        with C.Topology(comm, ranks_per_node=rpn, node_ids=node_ids, wait=mode) as topo:
            assert topo.waiter.mode == mode, (topo.waiter.mode, mode)
            record(topo)
            for seed, empty_odd, dtype in ((3, False, np.float32), (2, True, np.float64)):
                out += C.sparse_allreduce(topo, *sparse_input(rank, seed, False, empty_odd, dtype))
            big = np.random.default_rng(rank).standard_normal(40_000).astype(np.float32)  # > MPICH's eager size
            out.append(C.dense_allreduce(topo, big))
            out.append(C.dense_allreduce(topo, np.random.default_rng(rank).standard_normal((5, 4))))
    w, rec = C.Waiter(mode), Recording(comm)
    rng = np.random.default_rng(50 + rank)
    keys = np.unique(rng.integers(0, 10_000, size=20 + 10 * rank).astype(np.uint64))
    owner = owner_of(keys, size)
    out += C.exchange(rec, [np.full(j + rank, rank, dtype=np.uint64) for j in range(size)], waiter=w)
    out.append(C.pull_remote(rec, keys, owner, lambda a: row_of(a, D), waiter=w))
    out += C.push_to_owners(rec, keys, row_of(keys, D) + rank, owner, lambda k, r: (k.copy(), r.copy()), waiter=w)
    out += C.sparse_allreduce_allgather(rec, *sparse_input(rank, 3, False), waiter=w)
    return out, set(CALLS)


def run_channels(comm, mode):
    """Every collective of the trainer's channels, waiting in ``mode`` -> (results, names of the calls made)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    coll = Collectives(comm, mpi_wait=mode)
    for name in CHANNELS if size > 1 else ():
        getattr(coll, name).comm = Recording(getattr(coll, name).comm)
    CALLS.clear()
    ch, out = coll.train, []
    rng = np.random.default_rng(rank)
    keys = np.unique(rng.integers(0, 500, size=5 + 9 * rank).astype(np.uint64))
    out.append(ch.agree(np.array([rank, 1], np.int64), rank == 0)[0])
    ch.barrier()
    out += [ch.gather(keys.astype(np.float64)), ch.allgather((rank, "x" * rank)), ch.allgatherv(keys, C.SPARSE_KEYS)]
    asked, recv, order, send = ch.exchange_by_owner(keys, C.SPARSE_KEYS)
    out += [asked, ch.pull_owned(keys, lambda k: row_of(k, D).astype(np.float32))]
    out.append(ch.pull_rows(np.arange(40, dtype=np.uint64), lambda k: row_of(k, D).astype(np.float32)))
    out.append(ch.dense_allreduce(rng.standard_normal(40_001).astype(np.float32)))
    blocks = rng.standard_normal((size, 257)).astype(np.float32)
    pending = ch.start_reduce_scatter(blocks)
    out.append(ch.alltoallv(keys[order], send, recv, C.SPARSE_KEYS))
    got = ch.finish_reduce_scatter(pending)
    out += [got, ch.reduce_scatter(blocks.copy()), ch.allgather_chunks(got)]
    if size > 1:  # a block per rank riding in an alltoallv of rows (the fused train step)
        ch.start_blocks(C.SPARSE_ROWS, 257, 1, send, recv)[...] = blocks
        out += [a.copy() for a in ch.alltoallv_blocks(keys[order].astype(np.float32).reshape(-1, 1), C.SPARSE_ROWS,
                                                      C.DENSE_ALLREDUCE)]
    out += ch.sparse_allreduce(keys, row_of(keys, D).astype(np.float32) * (rank + 0.1))
    return out, set(CALLS)


def same_bits(a, b, what):
    assert len(a) == len(b), (what, len(a), len(b))
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), (what, i)
        else:
            assert x == y, (what, i, x, y)


def check(comm, run, what, yielded_calls, spun_calls):
    spun, spin_names = run(comm, "spin")
    yielded, yield_names = run(comm, "yield")
    same_bits(spun, yielded, what)
    spin_names, yield_names = (set().union(*comm.allgather(n)) for n in (spin_names, yield_names))  # every rank's
    if comm.Get_size() == 1:
        return
    assert not yield_names & BLOCKING, f"{what}, yielding, made blocking calls: {sorted(yield_names & BLOCKING)}"
    assert yielded_calls <= yield_names, f"{what}, yielding, never called {sorted(yielded_calls - yield_names)}"
    assert spun_calls <= spin_names, f"{what}, spinning, never called {sorted(spun_calls - spin_names)}"


def main():
    world = MPI.COMM_WORLD
    check(world, run_schedules, "schedules",
          {"Isend", "Irecv", "Iprobe", "Ibcast", "Ialltoall", "Ialltoallv", "Iallgather", "Iallgatherv"},
          {"Send", "Recv", "Sendrecv", "Probe", "Bcast", "Alltoall", "Alltoallv", "Allgatherv"})
    check(world, run_channels, "channels",
          {"Iallreduce", "Ibarrier", "Igatherv", "Iallgather", "Iallgatherv", "Ialltoall", "Ialltoallv"},
          {"Allreduce", "Barrier", "Gatherv", "allgather", "Allgatherv", "Alltoall", "Alltoallv"})
    world.Barrier()
    if world.Get_rank() == 0:
        print(f"check_waiter: OK on {world.Get_size()} ranks", flush=True)


if __name__ == "__main__":
    C.run_guarded(MPI.COMM_WORLD, main)
