"""Per-rank checks of hps.train._easgd's dense sync (``make_dense_sync("easgd", ...)``) against a serial EASGD written out in NumPy; run as
``mpiexec -n N python tests/mpi/check_easgd.py``. Prints ``check_easgd: OK on N ranks``.

Each rank contributes a known gradient per step; group g's copy steps with the mean of its ranks'
gradients (Adam), and every T steps one EASGD round runs (d = alpha (x - c); c += sum_g d; d is
subtracted from the copy at the next round). The serial reference runs the same on G copies.
"""

import shutil
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import hps.comm as C  # noqa: E402
from hps.model._dense_optim import DenseAdam  # noqa: E402
from hps.train._backend import HostBackend  # noqa: E402
from hps.train._collectives import Collectives  # noqa: E402
from hps.train._easgd import make_dense_sync  # noqa: E402

SHAPES = {"w": (3, 4), "b": (5,)}
STEPS, EVERY, ALPHA, LR = 13, 3, 0.2, 0.05


def initial():
    rng = np.random.default_rng(7)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def grad(rank, step):
    rng = np.random.default_rng(1000 * step + rank)
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def flat(d):
    return np.concatenate([d[k].ravel() for k in SHAPES])


def serial(size, G, steps=STEPS):
    """Every group's copy and the centre after ``steps`` steps, then the centre (EASGD's result)."""
    per = size // G
    copies = [initial() for _ in range(G)]
    opts = [DenseAdam(LR) for _ in range(G)]
    centre = flat(initial()).astype(np.float32)
    pending = [None] * G
    for s in range(steps):
        for g in range(G):
            gs = [grad(r, s) for r in range(g * per, (g + 1) * per)]
            mean = {k: (sum(x[k] for x in gs) / np.float32(per)).astype(np.float32) for k in SHAPES}
            opts[g].step(copies[g], mean)
        if G > 1 and (s + 1) % EVERY == 0:
            ds = []
            for g in range(G):
                if pending[g] is not None:
                    apply(copies[g], -pending[g])
                ds.append(np.float32(ALPHA) * (flat(copies[g]) - centre))
            centre = centre + sum(ds)
            pending = ds
    return centre if G > 1 else flat(copies[0])


def unflat(v):
    out, off = {}, 0
    for k, s in SHAPES.items():
        n = int(np.prod(s))
        out[k] = v[off:off + n].reshape(s)
        off += n
    return out


def apply(params, delta):
    off = 0
    for k, s in SHAPES.items():
        n = int(np.prod(s))
        params[k] += delta[off:off + n].reshape(s)
        off += n


def run(coll, G, compress, steps=STEPS, stop_at=None, state=None):
    """Train ``steps`` steps with the dense sync; with ``stop_at`` write its checkpoint state after that
    many steps into the HDF5 file ``state`` and stop; with ``state`` alone start from that file."""
    size, rank = coll.size, coll.rank
    params, opt = initial(), DenseAdam(LR)
    ds = make_dense_sync("easgd", coll, params, opt, HostBackend(None), compress=compress, groups=G, alpha=ALPHA,
                         every=EVERY)
    start = 0
    if state is not None and stop_at is None:
        with h5py.File(state, "r") as h:
            ds.read_checkpoint(h)
        ds.restore({})
        start = ds.steps
    try:
        for s in range(start, steps):
            g = flat(grad(rank, s)) / np.float32(size)       # as the model gives it: divided by n_total
            ds.step(unflat(g), 1, size)                      # summed over the group, then Adam's step
            if stop_at is not None and s + 1 == stop_at:
                with h5py.File(state, "w") as h:
                    ds.checkpoint_writer()(h)
                return None
        ds.finish()
        return flat(params), ds
    finally:
        ds.close()


def check_wait_counts_in_the_train_stage(world):
    """The group all-reduce runs on the train thread: a late partner's wait is MPI time of the train
    channel (the train stage's, not its own CPU) and of the job; the channels' communicators are freed.
    Groups of 2 (ranks 0 and 1 in the first)."""
    coll = Collectives(world, "spin")
    ds = make_dense_sync("easgd", coll, initial(), DenseAdam(LR), HostBackend(None), groups=world.Get_size() // 2,
                         every=EVERY)
    try:
        if world.Get_rank() == 1:
            time.sleep(0.5)
        ds.step(unflat(flat(grad(world.Get_rank(), 0))), 1, world.Get_size())
    finally:
        ds.close()
    if world.Get_rank() == 0:
        assert coll.train.mpi_seconds >= 0.4 and coll.mpi_seconds() >= 0.4, (coll.train.mpi_seconds, coll.mpi_seconds())
    coll.close()
    assert all(c.comm is None for c in [*coll.channels().values(), ds.group_ch, ds.bg_ch])


def main():
    world = MPI.COMM_WORLD
    size, rank = world.Get_size(), world.Get_rank()
    tmp = world.bcast(tempfile.mkdtemp(prefix="check-easgd-") if rank == 0 else None)
    for mode in ("spin", "yield"):
        coll = Collectives(world, mpi_wait=mode)
        for G in sorted({1, 2 if size % 2 == 0 else 1, size}):
            want = serial(size, G)
            got, ds = run(coll, G, "none")
            assert np.abs(got - want).max() <= 1e-5, (G, np.abs(got - want).max())
            every = np.array(world.allgather(got))
            assert (every == every[0]).all(), "ranks end with different models"
            sent = world.allreduce(coll.stats.bytes_sent[C.DENSE_EASGD])  # non-leaders send nothing
            assert (sent > 0) == (G > 1), sent
            if G > 1:
                assert ds.rounds == STEPS // EVERY, ds.rounds
                # a checkpoint after 7 steps (a round in flight), restored into a fresh dense sync,
                # continues exactly as the uninterrupted run
                state = str(Path(tmp) / f"rank{rank}-G{G}-{mode}.h5")
                run(coll, G, "none", stop_at=7, state=state)
                with h5py.File(state, "r") as h:
                    assert h["easgd"].attrs["groups"] == G and ("centre" in h["easgd"]) == (rank % (size // G) == 0)
                again, _ = run(coll, G, "none", state=state)
                assert np.array_equal(again, got), np.abs(again - got).max()
                before = world.allreduce(coll.stats.bytes_sent[C.DENSE_EASGD])
                low, _ = run(coll, G, "bf16")
                assert np.abs(low - want).max() <= 2e-2, np.abs(low - want).max()
                after = world.allreduce(coll.stats.bytes_sent[C.DENSE_EASGD]) - before
                assert after * 2 <= sent + 64 * size, (after, sent)  # bf16: half the bytes (padding aside)
            coll.stats.reset()
    if size >= 4:
        check_wait_counts_in_the_train_stage(world)
    world.Barrier()
    if rank == 0:
        shutil.rmtree(tmp)
        print(f"check_easgd: OK on {size} ranks", flush=True)


if __name__ == "__main__":
    C.run_guarded(MPI.COMM_WORLD, main)
