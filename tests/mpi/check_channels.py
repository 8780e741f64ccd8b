"""Per-rank checks of hps.train._collectives; run as ``mpiexec -n N python tests/mpi/check_channels.py``.

Every failure aborts the whole job (exit code != 0) with ``hps: rank R of N failed: ...`` on stderr.
"""

import sys
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.reference.comm import rank_order_sparse_sum, rank_order_sum, row_of  # noqa: E402

import hps.comm as C  # noqa: E402
from hps.mem import owner_of  # noqa: E402  the trainer's key -> rank policy
from hps.train._collectives import Collectives  # noqa: E402

D = 3


def keys_of(rank, seed=0):
    rng = np.random.default_rng(100 * seed + rank)
    return np.unique(rng.integers(0, 500, size=5 + 9 * rank).astype(np.uint64))


def check(coll, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    ch = coll.prepare
    # agree: per mini-batch totals and "anyone has more"
    totals, more = ch.agree(np.array([rank, 1, 0], np.int64), rank == size - 1)
    assert totals.tolist() == [size * (size - 1) // 2, size, 0] and more
    assert ch.agree(np.zeros(3, np.int64), False)[1] is False
    assert ch.any(rank == 0) and not ch.any(False)
    # alltoallv through the owners: every owner gets exactly the keys it owns, in rank order
    keys = keys_of(rank)
    asked, recv, order, send = ch.exchange_by_owner(keys, C.SPARSE_KEYS)
    every = [keys_of(r) for r in range(size)]
    want = np.concatenate([k[owner_of(k, size) == rank] for k in every])
    assert sorted(asked.tolist()) == sorted(want.tolist())
    assert recv.tolist() == [int((owner_of(k, size) == rank).sum()) for k in every]
    assert np.array_equal(owner_of(keys[order], size), np.repeat(np.arange(size), send))
    # pull_owned: rows from their owners, aligned with the asker's keys; each owner serves its own only
    served = []

    def serve(k):
        assert np.all(owner_of(k, size) == rank)
        served.append(k.shape[0])
        return row_of(k, D).astype(np.float32)

    rows = ch.pull_owned(keys, serve)
    assert np.array_equal(rows, row_of(keys, D).astype(np.float32)) and len(served) == 1
    # pull_rows (every rank the same keys), allgatherv, gather
    common = np.arange(40, dtype=np.uint64)
    assert np.array_equal(ch.pull_rows(common, serve), row_of(common, D).astype(np.float32))
    got = ch.allgatherv(keys, C.SPARSE_KEYS)
    assert np.array_equal(got, np.concatenate(every))
    g = ch.gather(keys.astype(np.float64))
    assert (g is None) == (rank != 0)
    if rank == 0:
        assert np.array_equal(g, np.concatenate(every).astype(np.float64))
    assert coll.stats.bytes_sent[C.SPARSE_KEYS] > 0 or size == 1
    # dense: every element summed in float32 in rank order, bit for bit (values of mixed magnitudes,
    # where another association gives other bits), and a vector shorter than the ranks
    rng = np.random.default_rng(7)
    vecs = [(rng.standard_normal(1001) * 10.0 ** rng.integers(-4, 5, 1001)).astype(np.float32) for _ in range(size)]
    for c in (coll.prepare, coll.train):
        for n in (1001, 1):
            v = vecs[rank][:n].copy()
            out = c.dense_allreduce(v)
            assert out is v and np.array_equal(v, rank_order_sum([x[:n] for x in vecs]))
    # a reduce-scatter started, another collective of the channel in between, then finished: rank order
    m = 257
    blocks = [(rng.standard_normal((size, m)) * 10.0 ** rng.integers(-4, 5, (size, m))).astype(np.float32)
              for _ in range(size)]
    mine = blocks[rank].copy()
    pending = coll.train.start_reduce_scatter(mine)
    between = coll.train.alltoallv(keys[order], send, recv, C.SPARSE_KEYS)     # issued while it runs
    assert sorted(between.tolist()) == sorted(want.tolist())
    got = coll.train.finish_reduce_scatter(pending)
    assert np.array_equal(got, rank_order_sum([b[rank] for b in blocks]))
    assert np.array_equal(mine, blocks[rank])                                   # the message is untouched
    assert np.array_equal(coll.train.reduce_scatter(blocks[rank].copy()), got)  # = the blocking one
    # the same into the caller's reused buffers (the dense shard's per-mini-batch buffers)
    parts, out = np.full((size, m), np.nan, np.float32), np.full((size, m), np.nan, np.float32)
    assert np.array_equal(coll.train.finish_reduce_scatter(coll.train.start_reduce_scatter(mine, parts)), got)
    assert all(np.array_equal(parts[s], blocks[s][rank]) for s in range(size))  # received there
    assert coll.train.allgather_chunks(got, out) is out
    assert all(np.array_equal(out[r], rank_order_sum([b[r] for b in blocks])) for r in range(size))
    if size > 1:
        check_blocks_ride(coll.train, keys[order], send, recv, blocks, out)
    # sparse all-reduce on the train channel: each key's rows summed in rank order, the same on every rank
    vals = [(row_of(every[r], D) * 10.0 ** rng.integers(-4, 5, (every[r].shape[0], 1))).astype(np.float32)
            for r in range(size)]
    k, s = coll.train.sparse_allreduce(keys, vals[rank])
    want = rank_order_sparse_sum([(every[r], vals[r]) for r in range(size)])
    assert sorted(k.tolist()) == sorted(want) and k.shape[0] == len(want)
    assert np.array_equal(s, np.array([want[x] for x in k.tolist()]).reshape(-1, D))
    same = comm.allgather((k.tobytes(), s.tobytes()))
    assert all(x == same[0] for x in same)


def check_blocks_ride(ch, keys, send, recv, blocks, gathered):
    """A block per rank riding in an alltoallv of rows (the fused train step, ``_sync.OwnerSync``): the
    rows arrive as the plain alltoallv's; the blocks folded in rank order give the reduce-scatter's bits; one
    block written for every rank gives the allgather; each kind's bytes are its own."""
    size, rank, m = ch.size, ch.rank, blocks[0].shape[1]
    rows = (row_of(keys, D) * (1 + rank)).astype(np.float32)                   # grouped by owner
    before = ch.stats.bytes_sent[C.SPARSE_ROWS]
    plain = ch.alltoallv(rows, send, recv, C.SPARSE_ROWS)
    plain_bytes, before = ch.stats.bytes_sent[C.SPARSE_ROWS] - before, dict(ch.stats.bytes_sent)
    for _ in range(2):                                                          # the buffers reused
        ch.start_blocks(C.SPARSE_ROWS, m, D, send, recv)[...] = blocks[rank]
        got, parts = ch.alltoallv_blocks(rows, C.SPARSE_ROWS, C.DENSE_ALLREDUCE)
        assert np.array_equal(got, plain) and parts.shape == (size, m)
        assert all(np.array_equal(parts[s], blocks[s][rank]) for s in range(size))
        assert np.array_equal(C._ordered.fold_parts(parts), rank_order_sum([b[rank] for b in blocks]))
    sent = {k: ch.stats.bytes_sent[k] - before[k] for k in (C.SPARSE_ROWS, C.DENSE_ALLREDUCE)}
    assert sent == {C.SPARSE_ROWS: 2 * plain_bytes, C.DENSE_ALLREDUCE: 2 * (size - 1) * m * 4}, sent
    none, zero = np.empty((0, D), np.float32), np.zeros(size, np.int64)
    ch.start_blocks(C.SPARSE_GRADS, m, D, zero, zero)[...] = gathered[rank]
    got, every = ch.alltoallv_blocks(none, C.SPARSE_GRADS, C.DENSE_ALLREDUCE)
    assert got.shape == (0, D) and np.array_equal(every, gathered)


def check_waiting_yields(comm):
    """In yield mode a rank that waits 1.5 s for a late peer spends almost no CPU doing so."""
    coll = Collectives(comm, mpi_wait="yield")
    assert coll.wait_mode == "yield"
    coll.main.barrier()
    if comm.Get_rank() == 1:
        time.sleep(1.5)
    before_cpu, before_wall = coll.main.mpi_cpu_seconds, coll.main.mpi_seconds
    coll.main.barrier()
    cpu, wall = coll.main.mpi_cpu_seconds - before_cpu, coll.main.mpi_seconds - before_wall
    if comm.Get_rank() == 0:
        assert wall > 1.0, wall
        assert cpu < 0.25 * wall, (cpu, wall)  # spinning would burn ~wall seconds of CPU


def main():
    world = MPI.COMM_WORLD
    for mode in ("spin", "yield"):
        coll = Collectives(world, mpi_wait=mode)
        assert coll.size == world.Get_size() and coll.wait_mode == (mode if coll.size > 1 else "local")
        check(coll, world)
    if world.Get_size() > 1:
        check_waiting_yields(world)
        auto = Collectives(world, mpi_wait="auto").wait_mode
        assert auto == ("yield" if world.Get_size() > C._wait.node_cores() else "spin"), auto
    world.Barrier()
    if world.Get_rank() == 0:
        print(f"check_channels: OK on {world.Get_size()} ranks", flush=True)


if __name__ == "__main__":
    C.run_guarded(MPI.COMM_WORLD, main)
