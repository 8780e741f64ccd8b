"""Rank 1 is killed (SIGKILL) while rank 0 waits in a collective: mpiexec must end, non-zero."""

import os
import signal

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.Get_rank() == 1:
    os.kill(os.getpid(), signal.SIGKILL)
comm.Barrier()
