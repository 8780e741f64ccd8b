"""What the trainer needs from its peers, for one process (``LocalCollectives``) or MPI ranks
(``MpiCollectives`` over ``hps.comm``). Every collective method is called by every rank in the same
order; ``owned_mask``, ``bytes_sent`` and ``warm_up`` are local.

``pull_rows`` runs in the prepare thread and the all-reduces (and a checkpoint's barriers) in the
train thread, so the MPI version gives each its own duplicate of the communicator (collectives of two
threads never interleave); evaluation and the final metrics use them from the caller's thread once
the pipeline has stopped. The caller's communicator itself is left to the caller.
"""

from __future__ import annotations

import time

import numpy as np

from .._hashing import group_by_owner, owner_of


class LocalCollectives:
    rank = 0
    size = 1

    def __init__(self):
        self.seconds = 0.0

    def owned_mask(self, keys):
        return np.ones(keys.shape[0], dtype=np.bool_)

    def pull_rows(self, keys, serve):
        """Rows of ``keys`` (the same keys on every rank): each owner serves its own.
        ``serve(k)`` returns (len(k), width) float32 rows, also for no keys."""
        return serve(keys)

    def sparse_allreduce(self, keys, values):
        """(keys, summed rows) over all ranks of distinct ``keys`` (u,) uint64 and ``values`` (u, d).
        One process: the same arrays back. Under MPI: the union of every rank's keys, ascending."""
        return keys, values

    def dense_allreduce(self, vec):
        return vec

    def gather(self, arr):
        """Concatenation of every rank's ``arr`` in rank order (rank 0 gets it; others get None)."""
        return arr

    def allsum(self, x: float) -> float:
        return x

    def allgather(self, x) -> list:
        """Every rank's small picklable ``x``, in rank order, on every rank."""
        return [x]

    def barrier(self):
        pass

    def bytes_sent(self) -> dict:
        return {"sparse_pull": 0, "sparse_allreduce": 0, "dense_allreduce": 0, "owner_writeback": 0}

    def warm_up(self, keys, width: int) -> None:
        """Compile the kernels these collectives run locally (``keys`` (n,) uint64, gradient rows of
        ``width`` float32). Local: no communication, so it is not collective."""


class MpiCollectives(LocalCollectives):
    """Collectives over an mpi4py communicator ``comm`` (never COMM_WORLD implicitly)."""

    def __init__(self, comm, ranks_per_node=None):
        from ..comm import CommStats, Topology

        super().__init__()
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._pull_comm = comm.Dup()
        self._train_comm = comm.Dup()
        self.topo = Topology(self._train_comm, ranks_per_node=ranks_per_node)
        self.stats = CommStats()

    def owned_mask(self, keys):
        return owner_of(keys, self.size) == self.rank

    def pull_rows(self, keys, serve):
        """Every rank passes the same ``keys``; each owner serves its own and an Allgatherv hands
        every rank all rows (rows of rank r arrive in the order of ``keys[owner == r]``)."""
        from mpi4py import MPI

        t = time.perf_counter()
        owner = owner_of(keys, self.size)
        order, offsets = group_by_owner(owner, self.size)
        mine = np.ascontiguousarray(serve(keys[order[offsets[self.rank]:offsets[self.rank + 1]]]),
                                    dtype=np.float32)
        width = mine.shape[1]  # the same on every rank: serve returns full rows even for no keys
        out = np.empty((keys.shape[0], width), dtype=np.float32)
        counts = np.diff(offsets) * width
        self._pull_comm.Allgatherv(mine, [out, counts, offsets[:-1] * width, MPI.FLOAT])
        rows = np.empty_like(out)
        rows[order] = out
        self.stats.add("sparse_pull", mine.nbytes * (self.size - 1), time.perf_counter() - t, 1)
        self.seconds += time.perf_counter() - t
        return rows

    def sparse_allreduce(self, keys, values):
        from ..comm import sparse_allreduce

        t = time.perf_counter()
        out = sparse_allreduce(self.topo, keys, values, stats=self.stats)
        self.seconds += time.perf_counter() - t
        return out

    def dense_allreduce(self, vec):
        from ..comm import dense_allreduce

        t = time.perf_counter()
        out = dense_allreduce(self.topo, vec, stats=self.stats)
        self.seconds += time.perf_counter() - t
        return out

    def gather(self, arr):
        parts = self._train_comm.gather(arr, root=0)
        return np.concatenate(parts) if self.rank == 0 else None

    def allsum(self, x: float) -> float:
        return float(self._train_comm.allreduce(x))

    def allgather(self, x) -> list:
        return list(self._train_comm.allgather(x))

    def barrier(self):
        self._train_comm.Barrier()

    def bytes_sent(self) -> dict:
        return dict(self.stats.bytes_sent)

    def warm_up(self, keys, width: int) -> None:
        from ..comm import compile_kernels

        group_by_owner(owner_of(keys, self.size), self.size)
        compile_kernels(width, np.float32)
