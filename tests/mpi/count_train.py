"""``python -m hps.train`` that counts the collectives of the train channel; run as
``mpiexec -n N python tests/mpi/count_train.py ARGS...``. At exit every rank prints one line
``count_train rank R: {json}`` with the number of calls of each Channel method on the train channel and
the train channel's collectives in all (``_call``: one MPI call, one wait)."""

import atexit
import collections
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hps.train import _collectives  # noqa: E402
from hps.train._main import main  # noqa: E402

COUNTS = collections.Counter()
RANK = os.environ.get("PMI_RANK", "0")  # mpiexec's (MPICH's) rank of this process


def counting(name, method):
    def call(self, *args, **kwargs):
        if self.name == "train" and self.comm is not None:  # not a one-process channel's
            COUNTS[name] += 1
        return method(self, *args, **kwargs)
    return call


for name in ("_call", "alltoallv", "alltoallv_blocks", "start_reduce_scatter", "allgather_chunks", "allsum_array"):
    setattr(_collectives.Channel, name, counting(name, getattr(_collectives.Channel, name)))
atexit.register(lambda: print(f"\ncount_train rank {RANK}: {json.dumps(dict(COUNTS))}\n", flush=True))

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
