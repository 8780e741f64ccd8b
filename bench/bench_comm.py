"""Hierarchical all-reduce against MPI's own ``Allreduce`` (dense), and the sparse exchanges: the
hierarchical sparse all-reduce (Appendix C.3), an allgather reduction, and the owner exchange of
``--sparse-sync owner``.

Run (osu-style: warm-up iterations, barrier, sweep of message sizes 1 KB ... 16 MB)::

    mpiexec -n 4 python -m bench.bench_comm [--ranks-per-node 2] [--json bench/results/comm.json]
            [--min-size 1024] [--max-size 16777216] [--dim 16]

Per size and operation each rank times ``iters`` calls between barriers; the table reports the
slowest rank's mean time per call (microseconds), hier/baseline ratio (< 1: hierarchical is faster)
and bytes each rank hands to MPI per call (CommStats; mean over ranks).

Workloads (message size S = bytes of one rank's input):
- dense: S / 4 float32; hierarchical ``dense_allreduce`` vs ``comm.Allreduce(MPI.SUM)``.
- sparse: S / (8 + 4 * dim) rows of (uint64 key, dim float32) per rank, keys drawn without
  replacement from 2 x rows distinct keys (about half of any two ranks' keys are shared);
  ``sparse_allreduce`` (hier) vs ``sparse_allreduce_allgather`` (base) vs the owner exchange of one
  mini-batch of the trainer's ``--sparse-sync owner`` (owner): each key's owner sends its row to the
  rank holding the key (alltoallv) and gets that rank's gradient back (alltoallv) and sums the
  contributions per key. The owner exchange leaves each sum at the key's owner only (which applies
  the update there), the all-reduces leave every sum on every rank; its key routing is done once per
  batch in the trainer's prepare stage and is not timed here.

On the 2-core development machine 4 ranks are oversubscribed (two ranks per core): timings include
time slicing, and every "node" is the same shared memory. Numbers are for comparing the schedules,
not for predicting a cluster.
"""

from __future__ import annotations

import json
import os
import platform
import time

from hps._argparse import ArgumentParser


def _iters(size):
    """Calls per measurement: up to 50 for small messages, at least 3 for large ones (2 shared cores)."""
    return int(min(50, max(3, (2 << 20) // max(size, 1))))


def _time(comm, fn, iters, warmup):
    for _ in range(warmup):
        fn()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    return comm.allreduce(dt, op=_max_op())


def _max_op():
    from mpi4py import MPI

    return MPI.MAX


def _sizes(lo, hi):
    s = lo
    while s <= hi:
        yield s
        s *= 4


def run(comm, ranks_per_node, min_size, max_size, dim, seed=7):
    import numpy as np
    from mpi4py import MPI

    from hps.comm import (SPARSE_GRADS, SPARSE_KEYS, SPARSE_ROWS, CommStats, Topology, dense_allreduce,
                          sparse_allreduce, sparse_allreduce_allgather)
    from hps.comm._kernels import segment_sum
    from hps.train._collectives import Channel
    from hps.train._sync import unique_inverse

    rank, size = comm.Get_rank(), comm.Get_size()
    topo = Topology(comm, ranks_per_node=ranks_per_node)
    rows_out = []
    for s in _sizes(min_size, max_size):
        iters = _iters(s)
        warmup = max(1, iters // 10)
        # dense
        a = np.random.default_rng(seed + rank).standard_normal(s // 4).astype(np.float32)
        out = np.empty_like(a)
        st = CommStats()
        t_h = _time(comm, lambda: dense_allreduce(topo, a, out=out, stats=st), iters, warmup)
        ref = np.empty_like(a)
        t_b = _time(comm, lambda: comm.Allreduce(a, ref, op=MPI.SUM), iters, warmup)
        assert np.allclose(out, ref, rtol=1e-4, atol=1e-3), "dense results differ"
        b_h = comm.allreduce(st.bytes_sent["dense_allreduce"] / st.calls["dense_allreduce"]) / size
        b_b = s * 2 * (size - 1) / size  # a bandwidth-optimal Allreduce sends 2 (p-1)/p S per rank
        rows_out.append(dict(op="dense", size=s, iters=iters, hier_us=t_h * 1e6, base_us=t_b * 1e6,
                             hier_bytes=b_h, base_bytes=b_b))
        # sparse
        n = max(1, s // (8 + 4 * dim))
        rng = np.random.default_rng(seed * 1000 + rank)
        keys = rng.choice(2 * n, size=n, replace=False).astype(np.uint64)
        vals = rng.standard_normal((n, dim)).astype(np.float32)
        sh, sb = CommStats(), CommStats()
        res = {}
        t_h = _time(comm, lambda: res.__setitem__("h", sparse_allreduce(topo, keys, vals, stats=sh)), iters, warmup)
        t_b = _time(comm, lambda: res.__setitem__("b", sparse_allreduce_allgather(comm, keys, vals, stats=sb)),
                    iters, warmup)
        assert np.array_equal(res["h"][0], res["b"][0]) and np.allclose(res["h"][1], res["b"][1], atol=1e-4)
        per_call = lambda stt: comm.allreduce(stt.bytes_sent["sparse_allreduce"] / stt.calls["sparse_allreduce"]) / size  # noqa: E731
        # owner exchange: route the keys once (the trainer's prepare stage), then time rows out + grads back
        so = CommStats()
        ch = Channel("bench", comm, so)
        asked, recv, order, send = ch.exchange_by_owner(keys, SPARSE_KEYS)
        owned, uinv = unique_inverse(asked)
        table = np.random.default_rng(seed + 7 * rank).standard_normal((owned.size, dim)).astype(np.float32)
        so.reset()

        def owner_step():
            ch.alltoallv(table[uinv], recv, send, SPARSE_ROWS)
            res["o"] = segment_sum(ch.alltoallv(vals[order], send, recv, SPARSE_GRADS), uinv, owned.size)

        t_o = _time(comm, owner_step, iters, warmup)
        sums = dict(zip(res["h"][0].tolist(), range(len(res["h"][0]))))
        assert np.allclose(res["o"], res["h"][1][[sums[k] for k in owned.tolist()]], atol=1e-4), "owner sums differ"
        o_bytes = comm.allreduce((so.bytes_sent[SPARSE_ROWS] + so.bytes_sent[SPARSE_GRADS]) / so.calls[SPARSE_GRADS]) / size
        rows_out.append(dict(op="sparse", size=s, iters=iters, hier_us=t_h * 1e6, base_us=t_b * 1e6,
                             hier_bytes=per_call(sh), base_bytes=per_call(sb), owner_us=t_o * 1e6,
                             owner_bytes=o_bytes, rows=n, result_rows=len(res["h"][0])))
    meta = dict(ranks=size, n_nodes=topo.n_nodes, node_sizes=list(topo.node_sizes), ranks_per_node=ranks_per_node,
                dim=dim, host=platform.node(), cpus=os.cpu_count(), oversubscribed=size > (os.cpu_count() or 1),
                mpi=MPI.Get_library_version().splitlines()[0].strip(), baseline_dense="MPI Allreduce",
                baseline_sparse="allgather + merge")
    topo.free()
    return meta, rows_out


def _fmt_size(s):
    return f"{s >> 20} MB" if s >= 1 << 20 else f"{s >> 10} KB"


def main(argv=None):
    p = ArgumentParser(prog="python -m bench.bench_comm", description=__doc__.split("\n")[0])
    p.add_argument("--ranks-per-node", type=int, default=None, help="override node grouping (default: shared memory)")
    p.add_argument("--min-size", type=int, default=1 << 10)
    p.add_argument("--max-size", type=int, default=16 << 20)
    p.add_argument("--dim", type=int, default=16, help="row width of the sparse workload (float32)")
    p.add_argument("--json", default=None, help="write the table and metadata here (rank 0)")
    args = p.parse_args(argv)

    from mpi4py import MPI

    from hps.comm import run_guarded

    comm = MPI.COMM_WORLD
    meta, rows = run_guarded(comm, run, comm, args.ranks_per_node, args.min_size, args.max_size, args.dim)
    if comm.Get_rank() != 0:
        return 0
    print(f"# hps.comm all-reduce: {meta['ranks']} ranks, nodes {meta['node_sizes']}, {meta['cpus']} cpus"
          f"{' (OVERSUBSCRIBED)' if meta['oversubscribed'] else ''}; {meta['mpi']}")
    print(f"{'op':<7}{'size':>8}{'iters':>7}{'hier us':>12}{'base us':>12}{'ratio':>8}{'hier MB/rank':>14}"
          f"{'base MB/rank':>14}{'owner us':>12}{'owner MB/rank':>15}")
    for r in rows:
        owner = (f"{r['owner_us']:>12.1f}{r['owner_bytes'] / 1e6:>15.3f}" if "owner_us" in r else f"{'-':>12}{'-':>15}")
        print(f"{r['op']:<7}{_fmt_size(r['size']):>8}{r['iters']:>7}{r['hier_us']:>12.1f}{r['base_us']:>12.1f}"
              f"{r['hier_us'] / r['base_us']:>8.2f}{r['hier_bytes'] / 1e6:>14.3f}{r['base_bytes'] / 1e6:>14.3f}{owner}")
    print("# base: dense = MPI Allreduce (base bytes = 2(p-1)/p S, the bandwidth-optimal count);"
          " sparse = allgather + merge. ratio = hier / base (< 1: hierarchical faster);"
          " owner = the --sparse-sync owner exchange of one mini-batch (rows out, gradients back)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
