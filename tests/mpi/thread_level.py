"""MPI initialised below MPI_THREAD_MULTIPLE: the trainer's collectives refuse with a clear error."""

import sys
from pathlib import Path

import mpi4py

mpi4py.rc.thread_level = "serialized"
from mpi4py import MPI  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from hps.errors import CommError  # noqa: E402
from hps.train._collectives import Collectives  # noqa: E402

if __name__ == "__main__":
    try:
        Collectives(MPI.COMM_WORLD)
    except CommError as e:
        print(f"refused: {e}", flush=True)
        sys.exit(0)
    print("accepted a serialized MPI", flush=True)
    sys.exit(3)
