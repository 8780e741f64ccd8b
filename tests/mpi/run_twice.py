"""Two ``hps.train.run`` calls in one process under MPI (``mpiexec -n N python tests/mpi/run_twice.py``):
each job's communicators are freed when it ends (a library user's loop of jobs ran out of them: MPICH
refused the 2,045th), and the second job trains as the first."""

import sys
from pathlib import Path

from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hps.cli import parse_config  # noqa: E402
from hps.train import _run  # noqa: E402

made = []


class Recorded(_run.Collectives):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        made.append(self)


def main():
    _run.Collectives = Recorded
    cfg = parse_config(["--rows", "4000", "--fields", "4", "--vocab-per-field", "500", "--batch-size", "1024",
                        "--minibatch-size", "256", "--hidden", "8", "--embedding-dim", "4", "--no-progress",
                        "--dense-sync", "easgd", "--groups", "2"])
    losses = [_run.run(cfg, MPI.COMM_WORLD, log=lambda *a, **k: None)["loss_per_batch"] for _ in range(2)]
    assert losses[0] == losses[1], losses
    assert len(made) == 2 and all(c.comm is None for coll in made for c in [*coll.channels().values(), *coll._extra])
    assert len(made[0]._extra) == 2     # EASGD's group and rounds channels
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"run_twice: OK on {MPI.COMM_WORLD.Get_size()} ranks", flush=True)


if __name__ == "__main__":
    from hps.comm import run_guarded

    run_guarded(MPI.COMM_WORLD, main)
