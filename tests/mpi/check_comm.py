"""Per-rank checks of hps.comm; run as ``mpiexec -n N python tests/mpi/check_comm.py``.

Every failure aborts the whole job (exit code != 0) with ``hps: rank R of N failed: ...`` on stderr.
"""

import hashlib
import sys
from pathlib import Path

import numpy as np
from mpi4py import MPI

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.reference.comm import owner_of, row_of, serial_dense_allreduce, serial_sparse_allreduce  # noqa: E402

import hps.comm as C  # noqa: E402
from hps.errors import InvalidInputError  # noqa: E402

D = 3


def sparse_input(rank, seed, integer, empty_odd=False, dtype=np.float32):
    """Rank-dependent keys (with duplicates, unsorted) and values; reproducible on every rank."""
    rng = np.random.default_rng(1000 * seed + rank)
    if empty_odd and rank % 2 == 1:
        return np.empty(0, np.uint64), np.empty((0, D), dtype)
    n = 5 + 7 * rank
    keys = rng.integers(0, 40, size=n).astype(np.uint64) + np.uint64(rank * 13)
    keys[0] = np.uint64(2**63 + 5)  # a shared big key
    if integer:
        values = ((rank + 1) * (keys[:, None] % np.uint64(7)).astype(np.float64) + np.arange(D)).astype(dtype)
    else:
        values = rng.standard_normal((n, D)).astype(dtype)
    return keys, values


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def same_everywhere(comm, *arrays):
    ds = comm.allgather(digest(*arrays))
    assert all(x == ds[0] for x in ds), f"results differ between ranks: {ds}"


def check_sparse(topo, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    # closed form: integer-valued floats sum exactly in any order
    for seed, empty_odd in ((1, False), (2, True)):
        for dtype in (np.float32, np.float64):
            inputs = [sparse_input(r, seed, True, empty_odd, dtype) for r in range(size)]
            stats = C.CommStats()
            k, v = C.sparse_allreduce(topo, *inputs[rank], stats=stats)
            rk, rv = serial_sparse_allreduce(inputs, D, dtype)
            assert k.dtype == np.uint64 and v.dtype == dtype, (k.dtype, v.dtype)
            assert np.array_equal(k, rk), (k, rk)
            assert np.array_equal(v, rv), np.abs(v - rv).max()
            total = comm.allreduce(stats.bytes_sent["sparse_allreduce"])
            assert (total > 0) == (size > 1), total
            assert stats.calls["sparse_allreduce"] == 1
            kb, vb = C.sparse_allreduce_allgather(comm, *inputs[rank])
            assert np.array_equal(kb, rk) and np.array_equal(vb, rv)
    # random floats: close to the reference, identical bits on every rank
    inputs = [sparse_input(r, 3, False) for r in range(size)]
    k, v = C.sparse_allreduce(topo, *inputs[rank])
    rk, rv = serial_sparse_allreduce(inputs, D, np.float64)
    assert np.array_equal(k, rk)
    np.testing.assert_allclose(v, rv, rtol=1e-5, atol=1e-5)
    same_everywhere(comm, k, v)
    kb, vb = C.sparse_allreduce_allgather(comm, *inputs[rank])
    same_everywhere(comm, kb, vb)
    np.testing.assert_allclose(vb, rv, rtol=1e-5, atol=1e-5)
    # every rank empty
    k, v = C.sparse_allreduce(topo, np.empty(0, np.uint64), np.empty((0, D), np.float32))
    assert k.shape == (0,) and v.shape == (0, D) and v.dtype == np.float32


def check_dense(topo, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    arrays = [np.random.default_rng(r).standard_normal((5, 4)) for r in range(size)]
    out = C.dense_allreduce(topo, arrays[rank])
    np.testing.assert_allclose(out, serial_dense_allreduce(arrays), rtol=1e-12, atol=1e-12)
    same_everywhere(comm, out)
    ints = [np.arange(1000, dtype=np.float32) * (r + 1) for r in range(size)]
    mine = ints[rank].copy()
    stats = C.CommStats()
    res = C.dense_allreduce(topo, mine, out=mine, stats=stats)  # in place
    assert res is mine and np.array_equal(mine, serial_dense_allreduce(ints))
    if topo.n_nodes > 1 or topo.local_size > 1:
        assert comm.allreduce(stats.bytes_sent["dense_allreduce"]) > 0
    assert stats.calls["dense_allreduce"] == 1


def check_exchange(comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    # list form: rank r sends (j + r) copies of r to rank j
    blocks = [np.full(j + rank, rank, dtype=np.uint64) for j in range(size)]
    got = C.exchange(comm, blocks)
    assert len(got) == size
    for src, b in enumerate(got):
        assert np.array_equal(b, np.full(rank + src, src, dtype=np.uint64)), (src, b)
    # pull: keys owned by key % size; rows depend only on the key
    rng = np.random.default_rng(50 + rank)
    keys = np.unique(rng.integers(0, 10_000, size=20 + 10 * rank).astype(np.uint64))
    rng.shuffle(keys)
    owner = owner_of(keys, size)
    served = []

    def serve(asked):
        assert asked.dtype == np.uint64
        assert np.all(owner_of(asked, size) == rank), "asked for a key this rank does not own"
        served.append(asked.shape[0])
        return row_of(asked, D)

    stats = C.CommStats()
    rows = C.pull_remote(comm, keys, owner, serve, stats=stats)
    assert served and len(served) == 1
    assert np.array_equal(rows, row_of(keys, D))
    remote = int((owner != rank).sum())
    assert stats.bytes_sent["sparse_pull"] >= remote * 8
    # push: owners receive exactly the keys they own, with their rows
    received = []

    def apply(k, r):
        assert np.all(owner_of(k, size) == rank)
        received.append((k.copy(), r.copy()))
        return k.shape[0]

    n_in = C.push_to_owners(comm, keys, row_of(keys, D) + rank, owner, apply)
    assert len(received) == 1 and n_in == received[0][0].shape[0]
    all_pushed = comm.allgather((keys, owner))
    want = sorted(int(k) for ks, ow in all_pushed for k in ks[ow == rank])
    assert sorted(received[0][0].tolist()) == want
    senders = np.concatenate([np.full(int((ow == rank).sum()), r) for r, (ks, ow) in enumerate(all_pushed)])
    assert np.array_equal(received[0][1], row_of(received[0][0], D) + senders[:, None])
    # empty pulls on every rank
    rows = C.pull_remote(comm, np.empty(0, np.uint64), np.empty(0, np.int32), lambda a: row_of(a, D))
    assert rows.shape == (0, D)


def layouts(size):
    """(ranks_per_node, node_ids) pairs valid for ``size`` ranks, with the expected node sizes."""
    out = [(None, None)]
    out += [(rpn, None) for rpn in range(1, size + 1) if size % rpn == 0]
    if size == 4:
        out += [(None, [0, 0, 0, 1]), (None, [0, 1, 1, 2]), (None, [0, 1, 0, 1])]
    if size == 3:
        out += [(None, [0, 0, 1])]
    return out


def check_topology_layout(topo, rpn, node_ids, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    if rpn is not None:
        assert topo.n_nodes == size // rpn and topo.node_id == rank // rpn and topo.local_rank == rank % rpn
        assert topo.node_sizes == (rpn,) * (size // rpn) and topo.uniform
        assert topo.cross_comm.Get_size() == size // rpn and topo.cross_comm.Get_rank() == topo.node_id
    if node_ids is not None:
        assert topo.n_nodes == len(set(node_ids))
        assert topo.local_size == node_ids.count(node_ids[rank])
    assert (topo.leader_comm is not None) == (topo.local_rank == 0)
    assert sum(topo.node_sizes) == size


def check_validation(comm):
    size = comm.Get_size()
    if size > 2:
        for bad in (size - 1, 0):
            try:
                C.Topology(comm, ranks_per_node=bad)
            except InvalidInputError as e:
                assert "ranks_per_node" in str(e)
            else:
                raise AssertionError(f"ranks_per_node={bad} accepted for {size} ranks")
    if size > 1:
        try:
            C.Topology(comm, ranks_per_node=1 if comm.Get_rank() == 0 else size)
        except InvalidInputError as e:
            assert "differ" in str(e)
        else:
            raise AssertionError("different ranks_per_node on different ranks accepted")


def main():
    world = MPI.COMM_WORLD
    dup = world.Dup()
    for name, comm in (("world", world), ("dup", dup), ("self", MPI.COMM_SELF)):
        for rpn, node_ids in layouts(comm.Get_size()):
            with C.Topology(comm, ranks_per_node=rpn, node_ids=node_ids) as topo:
                check_topology_layout(topo, rpn, node_ids, comm)
                check_sparse(topo, comm)
                check_dense(topo, comm)
        check_exchange(comm)
        check_validation(comm)
    assert C.cuda_aware(world) is False  # the pip MPICH is not CUDA-aware
    dup.Free()
    world.Barrier()
    if world.Get_rank() == 0:
        print(f"check_comm: OK on {world.Get_size()} ranks", flush=True)


if __name__ == "__main__":
    C.run_guarded(MPI.COMM_WORLD, main)
