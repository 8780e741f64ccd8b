"""Rank 1 raises while rank 0 waits in a collective: the job must end fast, naming rank 1."""

import sys
from pathlib import Path

from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import numpy as np  # noqa: E402

import hps.comm as C  # noqa: E402


def main(comm):
    if comm.Get_rank() == 1:
        raise ValueError("injected failure on purpose")
    C.dense_allreduce(C.Topology(MPI.COMM_SELF), np.ones(3))  # local work, then hang in a collective:
    comm.Barrier()


if __name__ == "__main__":
    C.run_guarded(MPI.COMM_WORLD, main, MPI.COMM_WORLD)
