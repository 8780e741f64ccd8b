"""hps.comm input validation: bad arguments raise typed errors (on every rank, so no rank hangs), and
exchanged blocks are never silently promoted to another dtype.

In-process checks run on ``MPI.COMM_SELF``; the multi-rank ones run a script written here under
``mpiexec -n 2`` with a timeout (and a per-rank alarm), so a rank that hangs fails the test.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

MPI = pytest.importorskip("mpi4py.MPI")

import hps.comm as C  # noqa: E402
from hps.errors import InvalidInputError, InvalidTypeError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- one process


@pytest.mark.parametrize(
    "node_ids, error",
    [
        ([-1], InvalidInputError),
        ([2**40], InvalidInputError),  # was an untyped OverflowError from Split
        ([2**31], InvalidInputError),
        (["a"], InvalidTypeError),  # was an untyped ValueError
        ("0", InvalidTypeError),
        (3, InvalidTypeError),  # was an untyped TypeError
        ([0.5], InvalidTypeError),  # was truncated to node 0
        ([float("nan")], InvalidTypeError),
        ([None], InvalidTypeError),
    ],
)
def test_topology_rejects_bad_node_ids_typed(node_ids, error):
    with pytest.raises(error, match="node_ids"):
        C.Topology(MPI.COMM_SELF, node_ids=node_ids)


@pytest.mark.parametrize("node_ids", [[0], [7], (2**31 - 1,), np.array([3], np.int64), [1.0]])
def test_topology_takes_integral_node_ids(node_ids):
    with C.Topology(MPI.COMM_SELF, node_ids=node_ids) as t:
        assert t.n_nodes == 1 and t.node_sizes == (1,)


def test_exchange_rejects_scalar_blocks_typed():
    with pytest.raises(InvalidInputError, match="scalar"):
        C.exchange(MPI.COMM_SELF, [np.float32(1)])  # was an untyped IndexError
    with pytest.raises(InvalidInputError, match="scalar"):
        C.exchange(MPI.COMM_SELF, (np.float32(1), [1]))


def test_exchange_counts_errors_typed():
    with pytest.raises(InvalidInputError, match="counts"):
        C.exchange(MPI.COMM_SELF, (np.ones(3), [2]))
    with pytest.raises(InvalidInputError, match="counts"):
        C.exchange(MPI.COMM_SELF, (np.ones(3), ["x"]))


@pytest.mark.parametrize(
    "keys, error",
    [
        (np.array([-1], np.int64), InvalidInputError),  # was returned as the sentinel key 2**64-1
        (np.array([2**64 - 1], np.uint64), InvalidInputError),
        (np.array([1.5]), InvalidTypeError),  # was truncated to key 1
        (np.array([1], np.int32), InvalidTypeError),
    ],
)
def test_ordered_sparse_allreduce_validates_keys(keys, error):
    with pytest.raises(error, match="keys"):
        C.ordered_sparse_allreduce(MPI.COMM_SELF, keys, np.ones((1, 2), np.float32))


def test_ordered_sparse_allreduce_takes_int64_keys_bitwise():
    k, v = C.ordered_sparse_allreduce(MPI.COMM_SELF, np.array([5, 2], np.int64), np.ones((2, 1), np.float32))
    assert k.dtype == np.uint64 and k.tolist() == [5, 2] and v.tolist() == [[1.0], [1.0]]


def test_het_control_comment_matches_the_packing():
    """het_control carries one bit per asked key (packed into whole bytes per rank), not one byte."""
    from hps.train import _het_sync

    src = (ROOT / "hps" / "comm" / "_stats.py").read_text()
    line = next(ln for ln in src.splitlines() if ln.startswith("HET_CONTROL ="))
    assert "one bit per asked key" in line and "byte per" not in line
    mask = np.zeros(9, bool)
    mask[[0, 8]] = True
    packed = _het_sync._pack(mask, np.array([9]))
    assert packed.nbytes == 2 and _het_sync._unpack(packed, np.array([9])).tolist() == mask.tolist()


# ---------------------------------------------------------------- two ranks (mpiexec)

SCRIPT = r'''
import signal
import sys
signal.alarm(45)  # a rank left waiting in a collective dies instead of hanging the test
import numpy as np
from mpi4py import MPI
import hps.comm as C
from hps.errors import HpsError

comm = MPI.COMM_WORLD
rank = comm.rank
cases = {
    "topo_negative": lambda: C.Topology(comm, node_ids=[0, -1]),
    "topo_big": lambda: C.Topology(comm, node_ids=[0, 2**40]),
    "topo_str_on_rank1": lambda: C.Topology(comm, node_ids=[0, 1] if rank == 0 else ["a", "b"]),
    "topo_int_on_rank1": lambda: C.Topology(comm, node_ids=[0, 1] if rank == 0 else 3),
    "topo_fraction": lambda: C.Topology(comm, node_ids=[0.5, 1.7]),
    "topo_fraction_on_rank1": lambda: C.Topology(comm, node_ids=[0, 1] if rank == 0 else [0, 1.5]),
    "topo_floats": lambda: C.Topology(comm, node_ids=[0.0, 1.0]),
    "topo_numpy": lambda: C.Topology(comm, node_ids=np.array([0, 0])),
    # uint64 keys next to an empty float64 block: they arrived reinterpreted as floats
    "ex_keys_empty_f64": lambda: C.exchange(comm, [np.empty(0), np.array([2**60 + 1, 42], np.uint64)]
                                            if rank == 0 else [np.empty(0, np.uint64)] * 2),
    # float32 rows next to np.empty((0, d)) as the docstring said: promoted to float64 on rank 0 only
    "ex_rows_empty_f64": lambda: C.exchange(comm, [np.empty((0, 2)), np.full((1, 2), 1.5, np.float32)]
                                            if rank == 0 else [np.full((1, 2), 2.5, np.float32)] * 2),
    # rank 1 has only empty float64 blocks while rank 0 sends uint64: it received garbage floats
    "ex_empty_rank_dtype": lambda: C.exchange(comm, [np.empty(0, np.uint64), np.array([7], np.uint64)]
                                              if rank == 0 else [np.empty(0)] * 2),
    "ex_mixed_dtypes": lambda: C.exchange(comm, [np.array([1], np.uint64), np.array([2.5])]),
    "ex_mixed_shapes_rank0": lambda: C.exchange(comm, [np.ones((1, 2)), np.ones((1, 3))]
                                                if rank == 0 else [np.ones((1, 2))] * 2),
    "ex_scalar_rank0": lambda: C.exchange(comm, [np.float32(1), np.ones(1, np.float32)]
                                          if rank == 0 else [np.ones(1, np.float32)] * 2),
    "pull_bad_owner_rank1": lambda: C.pull_remote(comm, np.array([1, 2], np.uint64),
                                                  np.array([0, 1]) if rank == 0 else np.array([0, 5]),
                                                  lambda k: np.ones((len(k), 2))),
    "ordered_neg_key": lambda: C.ordered_sparse_allreduce(comm, np.array([-1], np.int64), np.ones((1, 2), np.float32)),
    "ordered_float_key": lambda: C.ordered_sparse_allreduce(comm, np.array([1.5]), np.ones((1, 2), np.float32)),
}


def show(r):
    if isinstance(r, C.Topology):
        s = f"nodes={r.n_nodes}"
        r.free()
        return s
    if isinstance(r, tuple):
        return ";".join(show(a) for a in r)
    if isinstance(r, list):
        return "[" + ",".join(show(a) for a in r) + "]"
    return f"{r.dtype.name}:{r.tolist()}"


log = open(f"{sys.argv[1]}/rank{rank}.txt", "w")  # one file per rank: mpiexec interleaves stdout
for name, fn in cases.items():
    try:
        res = "ok " + show(fn())
    except HpsError as e:
        res = "typed " + type(e).__name__
    except Exception as e:
        res = "UNTYPED " + type(e).__name__
    print(f"CASE {name} {rank} {res}", file=log, flush=True)
    comm.Barrier()
'''


@pytest.fixture(scope="module")
def two_ranks(mpiexec, tmp_path_factory):
    """{case: (rank 0's result, rank 1's result)} of SCRIPT under ``mpiexec -n 2``."""
    tmp = tmp_path_factory.mktemp("comm_validation")
    script = tmp / "cases.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_MCA_rmaps_base_oversubscribe="1")
    try:
        proc = subprocess.run([mpiexec, "-n", "2", sys.executable, str(script), str(tmp)], capture_output=True,
                              text=True, timeout=90, env=env, cwd=str(ROOT))
        out, err = proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        out, err = (e.stdout or b"").decode(), (e.stderr or b"").decode() + "\nTIMED OUT"
    got = {}
    logs = [tmp / f"rank{r}.txt" for r in (0, 1)]
    for line in [ln for f in logs if f.exists() for ln in f.read_text().splitlines()]:
        if line.startswith("CASE "):
            _, name, rank, res = line.split(" ", 3)
            got.setdefault(name, [None, None])[int(rank)] = res
    return {k: tuple(v) for k, v in got.items()}, out[-3000:] + err[-3000:]


EXPECTED = {
    "topo_negative": ("typed InvalidInputError",) * 2,  # rank 0 hung in Dup
    "topo_big": ("typed InvalidInputError",) * 2,  # OverflowError and a hang
    "topo_str_on_rank1": ("typed InvalidTypeError",) * 2,
    "topo_int_on_rank1": ("typed InvalidTypeError",) * 2,
    "topo_fraction": ("typed InvalidTypeError",) * 2,  # was truncated to [0, 1]
    "topo_fraction_on_rank1": ("typed InvalidTypeError",) * 2,
    "topo_floats": ("ok nodes=2",) * 2,
    "topo_numpy": ("ok nodes=1",) * 2,
    "ex_keys_empty_f64": ("ok [uint64:[],uint64:[]]", "ok [uint64:[1152921504606846977, 42],uint64:[]]"),
    "ex_rows_empty_f64": ("ok [float32:[],float32:[[2.5, 2.5]]]", "ok [float32:[[1.5, 1.5]],float32:[[2.5, 2.5]]]"),
    "ex_empty_rank_dtype": ("typed InvalidTypeError",) * 2,
    "ex_mixed_dtypes": ("typed InvalidTypeError",) * 2,
    "ex_mixed_shapes_rank0": ("typed InvalidInputError",) * 2,
    "ex_scalar_rank0": ("typed InvalidInputError",) * 2,
    "pull_bad_owner_rank1": ("typed InvalidInputError",) * 2,
    "ordered_neg_key": ("typed InvalidInputError",) * 2,
    "ordered_float_key": ("typed InvalidTypeError",) * 2,
}


@pytest.mark.mpi
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_two_ranks_raise_typed_everywhere_or_deliver_exact_data(two_ranks, case):
    got, tail = two_ranks
    assert got.get(case) == EXPECTED[case], f"{case}: got {got.get(case)}\n{tail}"
