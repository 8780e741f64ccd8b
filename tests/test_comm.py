"""hps.comm: kernels and single-process behaviour in-process; multi-rank behaviour under mpiexec.

The multi-rank checks live in tests/mpi/*.py (plain scripts, one process per rank, non-zero exit on
failure); the tests here spawn them with ``mpiexec -n N`` and a timeout.
"""

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

MPI = pytest.importorskip("mpi4py.MPI")

import hps.comm as C  # noqa: E402
from hps.comm import _kernels as K  # noqa: E402
from hps.errors import InvalidInputError, InvalidTypeError  # noqa: E402
from tests.reference.comm import owner_of, row_of, serial_dense_allreduce, serial_sparse_allreduce  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MPI_DIR = Path(__file__).resolve().parent / "mpi"

keys_st = st.lists(st.integers(0, 50), max_size=40)


def _rows(n, d, seed, dtype=np.float64):
    return np.random.default_rng(seed).integers(-5, 6, size=(n, d)).astype(dtype)


# ---------------------------------------------------------------- kernels


@settings(max_examples=60, deadline=None)
@given(keys_st)
def test_reduce_sorted_matches_reference(ks):
    keys = np.sort(np.array(ks, dtype=np.uint64))
    vals = _rows(len(ks), 3, len(ks))
    k, v = K.reduce_sorted(keys, vals)
    rk, rv = serial_sparse_allreduce([(keys, vals)], 3, np.float64)
    assert np.array_equal(k, rk) and np.array_equal(v, rv)


@settings(max_examples=60, deadline=None)
@given(keys_st, keys_st)
def test_merge_sum_matches_reference_and_commutes(a, b):
    ka, kb = np.unique(np.array(a, dtype=np.uint64)), np.unique(np.array(b, dtype=np.uint64))
    rng = np.random.default_rng(len(a) * 100 + len(b))
    va, vb = rng.standard_normal((ka.size, 2)).astype(np.float32), rng.standard_normal((kb.size, 2)).astype(np.float32)
    k, v = K.merge_sum(ka, va, kb, vb)
    rk, rv = serial_sparse_allreduce([(ka, va), (kb, vb)], 2, np.float32)
    assert np.array_equal(k, rk)
    np.testing.assert_allclose(v, rv, rtol=1e-6, atol=1e-6)
    k2, v2 = K.merge_sum(kb, vb, ka, va)
    assert np.array_equal(k, k2) and v.tobytes() == v2.tobytes()  # same bits either way round


# ---------------------------------------------------------------- single process (COMM_SELF)


@pytest.fixture
def topo_self():
    with C.Topology(MPI.COMM_SELF) as t:
        yield t


def test_topology_self(topo_self):
    t = topo_self
    assert (t.size, t.n_nodes, t.node_id, t.local_rank, t.local_size) == (1, 1, 0, 0, 1)
    assert t.is_leader and t.leader_comm is not None and t.uniform and t.node_sizes == (1,)
    assert t.comm != MPI.COMM_SELF  # a private dup


def test_topology_rejects_bad_args():
    with pytest.raises(InvalidInputError, match="ranks_per_node"):
        C.Topology(MPI.COMM_SELF, ranks_per_node=0)
    with pytest.raises(InvalidInputError, match="ranks_per_node"):
        C.Topology(MPI.COMM_SELF, ranks_per_node=2)
    with pytest.raises(InvalidInputError, match="node_ids"):
        C.Topology(MPI.COMM_SELF, node_ids=[0, 1])
    with pytest.raises(InvalidInputError):
        C.Topology("not a comm")
    with pytest.raises(InvalidInputError, match="wait must be one of auto, spin, yield"):
        C.Topology(MPI.COMM_SELF, wait="sleep")
    with C.Topology(MPI.COMM_SELF, wait="yield") as t:
        assert t.waiter.mode == "yield"


@settings(max_examples=40, deadline=None)
@given(keys_st)
def test_sparse_allreduce_self_is_local_dedup(ks):
    keys = np.array(ks, dtype=np.uint64)
    vals = _rows(len(ks), 4, 7, np.float32)
    with C.Topology(MPI.COMM_SELF) as t:
        k, v = C.sparse_allreduce(t, keys, vals)
    rk, rv = serial_sparse_allreduce([(keys, vals)], 4, np.float32)
    assert np.array_equal(k, rk) and np.array_equal(v, rv) and v.dtype == np.float32
    kb, vb = C.sparse_allreduce_allgather(MPI.COMM_SELF, keys, vals)
    assert np.array_equal(kb, rk) and np.array_equal(vb, rv)


def test_sparse_allreduce_validates(topo_self):
    with pytest.raises(InvalidInputError, match="sentinel"):
        C.sparse_allreduce(topo_self, np.array([2**64 - 1], np.uint64), np.zeros((1, 2)))
    with pytest.raises(InvalidInputError, match="shape"):
        C.sparse_allreduce(topo_self, np.array([1, 2], np.uint64), np.zeros((3, 2)))
    with pytest.raises(InvalidTypeError):
        C.sparse_allreduce(topo_self, np.array([1], np.uint64), np.zeros((1, 2), np.int32))
    with pytest.raises(InvalidTypeError):
        C.sparse_allreduce(topo_self, np.array([1.5]), np.zeros((1, 2)))


def test_sparse_allreduce_does_not_alias_input(topo_self):
    keys, vals = np.array([1, 2], np.uint64), np.ones((2, 2))
    k, v = C.sparse_allreduce(topo_self, keys, vals)
    v[:] = 9
    assert (vals == 1).all()


def test_dense_allreduce_self(topo_self):
    a = np.arange(12.0).reshape(3, 4)
    out = C.dense_allreduce(topo_self, a)
    assert np.array_equal(out, a) and out is not a
    assert C.dense_allreduce(topo_self, a, out=a) is a
    with pytest.raises(InvalidInputError, match="out"):
        C.dense_allreduce(topo_self, a, out=np.empty(5))
    with pytest.raises(InvalidTypeError):
        C.dense_allreduce(topo_self, np.array(["x"]))
    assert np.array_equal(serial_dense_allreduce([a, a]), 2 * a)


def test_exchange_pull_push_self():
    comm = MPI.COMM_SELF
    keys = np.array([9, 4, 7], np.uint64)
    assert np.array_equal(C.exchange(comm, [keys])[0], keys)
    data, counts = C.exchange(comm, (row_of(keys, 2), np.array([3])))
    assert np.array_equal(data, row_of(keys, 2)) and counts.tolist() == [3]
    stats = C.CommStats()
    rows = C.pull_remote(comm, keys, owner_of(keys, 1), lambda k: row_of(k, 2), stats=stats)
    assert np.array_equal(rows, row_of(keys, 2))
    assert stats.bytes_sent["sparse_pull"] == 0 and stats.calls["sparse_pull"] == 1  # self-sends are free
    got = C.push_to_owners(comm, keys, rows, np.zeros(3, np.int32), lambda k, r: (k, r), stats=stats)
    assert np.array_equal(got[0], keys) and np.array_equal(got[1], rows)
    with pytest.raises(InvalidInputError, match="owner"):
        C.pull_remote(comm, keys, np.array([0, 1, 0]), lambda k: row_of(k, 2))
    with pytest.raises(InvalidInputError, match="serve_fn"):
        C.pull_remote(comm, keys, np.zeros(3, np.int32), lambda k: np.zeros(len(k)))
    with pytest.raises(InvalidInputError, match="one block per rank"):
        C.exchange(comm, [keys, keys])
    with pytest.raises(InvalidInputError, match="kind"):
        C.exchange(comm, [keys], kind="bogus")


def test_segment_sum_adds_in_input_order():
    rng = np.random.default_rng(3)
    idx = rng.integers(0, 5, size=40)
    vals = rng.standard_normal((40, 3)).astype(np.float32)
    out = K.segment_sum(vals, idx, 6)
    ref = np.zeros((6, 3), np.float32)
    for i, j in enumerate(idx):  # the same order of float32 additions
        ref[j] += vals[i]
    assert out.dtype == np.float32 and out.tobytes() == ref.tobytes()
    assert not out[5].any()


def test_trainer_channels_in_one_process():
    from hps.train._collectives import Collectives

    coll = Collectives()
    assert (coll.rank, coll.size, coll.wait_mode) == (0, 1, "local")
    keys = np.array([5, 9], np.uint64)
    for ch in coll.channels().values():
        assert ch.agree(np.array([3, 4]), True)[0].tolist() == [3, 4]
        assert ch.pull_owned(keys, lambda k: row_of(k, 2)).tolist() == row_of(keys, 2).tolist()
        assert ch.alltoallv(keys, np.array([2]), np.array([2]), C.SPARSE_KEYS) is keys
    assert coll.owned_mask(keys).all() and coll.bytes_sent()[C.SPARSE_ROWS] == 0


def test_poll_yields_then_sleeps_at_most_the_cap(monkeypatch):
    """``poll`` (yield mode): the first tests give the core away without sleeping, then sleeps grow to
    the cap and, on a short wait (no time passes here), never past it (a longer sleep leaves the peers'
    rendezvous waiting on this rank; long waits: tests/test_wait.py)."""
    from hps.comm import _wait as W

    class Request:
        def __init__(self, after):
            self.tests, self.after = 0, after

        def Test(self):
            self.tests += 1
            return self.tests > self.after

    yields, sleeps = [], []
    monkeypatch.setattr(W.os, "sched_yield", lambda: yields.append(1))
    monkeypatch.setattr(W.time, "sleep", sleeps.append)
    quick = Request(3)
    W.poll(quick)
    assert (quick.tests, len(yields), sleeps) == (4, 3, [])
    slow = Request(W.POLL_YIELDS + 12)
    W.poll(slow)
    assert slow.tests == W.POLL_YIELDS + 13 and len(sleeps) == 12
    assert sleeps[0] == W.POLL_FIRST_S and sleeps == sorted(sleeps) and max(sleeps) == W.POLL_MAX_S <= 2e-4


class _FakeRequest:
    """Completes on its second test; waiting on it (MPI's blocking wait) is a failure."""

    def __init__(self, log, done=None):
        self.log, self.done, self.tests = log, done, 0

    def Test(self):
        self.tests += 1
        if self.tests == 2 and self.done is not None:
            self.done()
        return self.tests >= 2

    def Wait(self):
        raise AssertionError("a yielding waiter waited inside MPI")


class _FakeComm:
    """One rank; records the name of every MPI method called. Non-blocking calls return _FakeRequests
    that deliver their data when they complete."""

    def __init__(self):
        self.log = []

    def Get_size(self):
        return 1

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.log.append(name)
            if name == "Iprobe":
                return self.log.count("Iprobe") >= 3        # a message is there at the third probe
            if name == "Iallgather":
                return _FakeRequest(self.log, lambda: args[1].__setitem__(slice(None), args[0]))
            if name == "Iallgatherv":
                return _FakeRequest(self.log, lambda: args[1][0].__setitem__(slice(None), args[0]))
            if name.startswith("I"):
                return _FakeRequest(self.log)
            return "blocking"
        return call


def test_waiter_yielding_makes_only_nonblocking_calls(monkeypatch):
    """Every method of a yielding Waiter starts MPI's non-blocking call and tests its request (never
    waits on it); a spinning one makes MPI's blocking call."""
    from hps.comm import _wait as W

    monkeypatch.setattr(W.os, "sched_yield", lambda: None)
    buf, status = np.zeros(3), object()
    calls = {"send": (buf, 1, 5), "recv": (buf, 1, 5), "sendrecv": (buf, buf, 1, 5), "probe": (1, 5, status),
             "bcast": (buf,)}
    want = {"send": ["Isend"], "recv": ["Irecv"], "sendrecv": ["Irecv", "Isend"], "probe": ["Iprobe"] * 3,
            "bcast": ["Ibcast"]}
    for method, args in calls.items():
        comm = _FakeComm()
        assert getattr(C.Waiter("yield"), method)(comm, *args) is None
        assert comm.log == want[method], (method, comm.log)
    comm = _FakeComm()
    assert C.Waiter("yield").allgather_obj(comm, {"a": [1, 2]}) == [{"a": [1, 2]}]
    assert comm.log == ["Iallgather", "Iallgatherv"]
    comm = _FakeComm()
    assert C.Waiter("yield").run(lambda: comm.Alltoall(), lambda: comm.Ialltoall()) is None
    assert comm.log == ["Ialltoall"]
    spin = {"send": ["Send"], "recv": ["Recv"], "sendrecv": ["Sendrecv"], "probe": ["Probe"], "bcast": ["Bcast"]}
    for method, args in calls.items():
        comm = _FakeComm()
        getattr(C.Waiter("spin"), method)(comm, *args)
        assert comm.log == spin[method], (method, comm.log)
    assert C.Waiter("spin").run(lambda: comm.Alltoall(), lambda: comm.Ialltoall()) == "blocking"
    with pytest.raises(InvalidInputError):
        C.Waiter("auto")                                     # resolved against a communicator first
    assert C.Waiter.resolve(None, "yield").mode == "spin"     # no communicator: nobody to wait for


def test_mpich_settings_are_asked_for_whole_or_not_at_all():
    from hps.comm._mpi import MPICH_SETTINGS, ask_mpich_settings

    env = {"PATH": "/bin", "MPI_LOCALNRANKS": "4"}
    assert ask_mpich_settings(env, cores=2) and env == {"PATH": "/bin", "MPI_LOCALNRANKS": "4", **MPICH_SETTINGS}
    assert int(env["MPIR_CVAR_CH4_PACK_BUFFER_SIZE"]) >= int(env["MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_CELL_SIZE"])
    # the user's choice, under any spelling MPICH reads: none of ours joins it
    for spelling in ("MPIR_CVAR_", "MPICH_", "MPIR_PARAM_"):
        mine = {"OMPI_COMM_WORLD_LOCAL_SIZE": "4", spelling + "CH4_IPC_CMA_P2P_THRESHOLD": "8192"}
        before = dict(mine)
        assert not ask_mpich_settings(mine, cores=2) and mine == before, spelling


def test_mpich_settings_are_asked_for_only_when_ranks_outnumber_cores():
    from hps.comm._mpi import ask_mpich_settings, node_cores

    for env in ({}, {"MPI_LOCALNRANKS": "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, {"MPI_LOCALNRANKS": "x"}):
        before = dict(env)
        assert not ask_mpich_settings(env, cores=2) and env == before, before
    assert ask_mpich_settings({"MPI_LOCALNRANKS": "3"}, cores=2)
    assert not ask_mpich_settings({"MPI_LOCALNRANKS": str(node_cores())})  # default: this process's cores
    assert ask_mpich_settings({"MPI_LOCALNRANKS": str(node_cores() + 1)})


def test_train_main_asks_for_mpich_settings_before_loading_mpi(monkeypatch):
    import hps.train._main as M
    from hps.comm._mpi import MPICH_SETTINGS, node_cores

    for k in MPICH_SETTINGS:  # set, then removed: undone at the end even if main() puts them
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)
    monkeypatch.setenv("MPI_LOCALNRANKS", str(node_cores() + 1))
    seen = []

    class Loaded(Exception):
        pass

    def load_mpi():
        seen.append({k: os.environ.get(k) for k in MPICH_SETTINGS})
        raise Loaded()

    monkeypatch.setattr(M, "_mpi_launched", lambda: True)
    monkeypatch.setattr(M, "load_mpi", load_mpi)
    monkeypatch.setattr(M, "parse_config", lambda argv: None)
    with pytest.raises(Loaded):
        M.main([])
    assert seen == [MPICH_SETTINGS]


def test_comm_stats():
    s = C.CommStats()
    s.add("dense_allreduce", 100, 0.5, calls=1)
    s.add("sparse_pull", 20)
    assert s.total_bytes == 120 and s.total_seconds == 0.5
    assert s.as_dict()["bytes_sent"]["dense_allreduce"] == 100
    with pytest.raises(InvalidInputError):
        s.add("other", 1)
    s.reset()
    assert s.total_bytes == 0 and set(s.bytes_sent) == set(C.KINDS)


def test_cuda_awareness_detection(monkeypatch):
    for var in (C.ENV_FORCE, "MPICH_GPU_SUPPORT_ENABLED", "OMPI_MCA_opal_cuda_support"):
        monkeypatch.delenv(var, raising=False)
    assert C.cuda_aware(MPI.COMM_SELF) is False  # pip MPICH: MPIX_Query_cuda_support() == 0
    monkeypatch.setenv(C.ENV_FORCE, "1")
    assert C.local_cuda_support() is True
    monkeypatch.setenv(C.ENV_FORCE, "0")
    monkeypatch.setenv("MPICH_GPU_SUPPORT_ENABLED", "1")
    assert C.local_cuda_support() is False
    monkeypatch.delenv(C.ENV_FORCE)
    monkeypatch.setenv("MPICH_GPU_SUPPORT_ENABLED", "0")
    assert C.local_cuda_support() is False


def test_host_arrays_are_not_device_arrays():
    a = np.zeros(3)
    assert not C.is_device_array(a) and C.to_host(a) is a


def test_failure_message():
    msg = C.failure_message(MPI.COMM_SELF, KeyError("k"))
    assert msg == "hps: rank 0 of 1 failed: KeyError: 'k'"


def test_library_never_uses_comm_world():
    for path in (ROOT / "hps" / "comm").glob("*.py"):
        tree = ast.parse(path.read_text())
        bad = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "COMM_WORLD"]
        assert not bad, f"{path.name} uses COMM_WORLD at lines {bad}"


# ---------------------------------------------------------------- GPU (skips itself without one)


@pytest.mark.gpu
def test_device_arrays_are_staged(topo_self):
    cupy = pytest.importorskip("cupy")
    a = cupy.arange(6, dtype=cupy.float32).reshape(2, 3)
    out = C.dense_allreduce(topo_self, a)
    assert isinstance(out, cupy.ndarray) and bool((out == a).all())
    k, v = C.sparse_allreduce(topo_self, cupy.asarray(np.array([3, 1, 3], np.uint64)), cupy.ones((3, 2)))
    assert k.tolist() == [1, 3] and isinstance(v, cupy.ndarray) and v.get().tolist() == [[1, 1], [2, 2]]
    from numba import cuda

    d = cuda.to_device(np.ones((4, 2)))
    assert np.array_equal(C.to_host(d), np.ones((4, 2)))


# ---------------------------------------------------------------- multi-process (mpiexec)


def _run(mpiexec, n, script, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_MCA_rmaps_base_oversubscribe="1")
    t0 = time.monotonic()
    proc = subprocess.run(
        [mpiexec, "-n", str(n), sys.executable, str(MPI_DIR / script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=str(ROOT),
    )
    return proc, time.monotonic() - t0


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_comm_under_mpiexec(mpiexec, n):
    # kernels are compiled (and cached) in this process first, so the ranks only load them
    K.merge_sum(np.zeros(1, np.uint64), np.zeros((1, 1)), np.zeros(1, np.uint64), np.zeros((1, 1)))
    proc, _ = _run(mpiexec, n, "check_comm.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"check_comm: OK on {n} ranks" in proc.stdout


@pytest.mark.mpi
def test_rank_that_raises_ends_the_job(mpiexec):
    proc, secs = _run(mpiexec, 2, "fail_raise.py", timeout=60)
    assert proc.returncode != 0 and secs < 60
    assert "hps: rank 1 of 2 failed: ValueError: injected failure on purpose" in proc.stderr


@pytest.mark.mpi
def test_killed_rank_ends_the_job(mpiexec):
    proc, secs = _run(mpiexec, 2, "fail_kill.py", timeout=60)
    assert proc.returncode != 0 and secs < 60


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_trainer_channels_under_mpiexec(mpiexec, n):
    proc, _ = _run(mpiexec, n, "check_channels.py", timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"check_channels: OK on {n} ranks" in proc.stdout


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3, 4])
def test_schedules_and_channels_wait_alike_spinning_or_yielding(mpiexec, n):
    """Every hps.comm schedule and trainer channel gives the same bits spinning and yielding, and
    yielding never makes a blocking MPI call (tests/mpi/check_waiter.py)."""
    K.merge_sum(np.zeros(1, np.uint64), np.zeros((1, 1)), np.zeros(1, np.uint64), np.zeros((1, 1)))
    proc, _ = _run(mpiexec, n, "check_waiter.py", timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"check_waiter: OK on {n} ranks" in proc.stdout


@pytest.mark.mpi
def test_trainer_collectives_need_thread_multiple(mpiexec):
    proc, _ = _run(mpiexec, 2, "thread_level.py", timeout=60)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "refused: MPI provides MPI_THREAD_SERIALIZED" in proc.stdout and "MPI_THREAD_MULTIPLE" in proc.stdout


@pytest.mark.mpi
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to pin 2 ranks apart")
def test_ranks_pinned_apart_share_the_node_cores(mpiexec):
    """Ranks pinned to CPUs of their own are not oversubscribed (tests/mpi/pinned_share.py): before, each
    counted only its own CPUs and 8 ranks pinned to 2 cores of 16 yielded in MPI waits with 1 core each."""
    proc, _ = _run(mpiexec, 2, "pinned_share.py", timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "pinned_share: OK on 2 ranks" in proc.stdout
