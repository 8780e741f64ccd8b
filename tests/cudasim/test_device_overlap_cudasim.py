"""The streams and events of ``--device cuda``'s prepare, place and train stages (``hps.gpu.PlanStreams``)
on Numba's CUDA simulator. The simulator has no streams, so a stand-in of CuPy's stream API records
every call (which stream, which event, which thread); the tests check the orderings the docstrings
promise: the plan streams are non-blocking; prepare records an event after its upload and dedup and
waits for it on the host; place makes its stream wait for that event before reading the raw arrays
and records its own after the plans; the train stage's stream waits for that one (on the device, no
host wait) before the batch's first kernel. An event is always recorded before anyone waits on it
(CUDA ignores a wait on an event not yet recorded)."""

import threading
from types import SimpleNamespace

import numpy as np
import pytest

import hps.train._device_backend as device_backend
from hps.gpu import PlanStreams, index_dtype
from hps.train._device_batch import raw_nbytes
from hps.train._sync import Plan, unique_inverse
from tests.cudasim.test_train_device_cuda_cudasim import TINY
from tests.cudasim.test_train_device_dedup_cudasim import _backend, _local

pytestmark = pytest.mark.cudasim


class FakeEvent:
    def __init__(self, log, stream):
        self.log, self.stream, self.recorded = log, stream, False

    def synchronize(self):
        assert self.recorded
        self.log.append(("host_wait", None, self, threading.current_thread().name))


class FakeStream:
    def __init__(self, api, name, non_blocking):
        self.api, self.name, self.non_blocking = api, name, non_blocking

    def __enter__(self):
        self.api.current.__dict__.setdefault("stack", []).append(self)
        return self

    def __exit__(self, *exc):
        self.api.current.stack.pop()

    def record(self):
        ev = FakeEvent(self.api.log, self)
        ev.recorded = True
        self.api.log.append(("record", self.name, ev, threading.current_thread().name))
        return ev

    def wait_event(self, ev):
        assert ev.recorded, "a wait on an event not yet recorded waits for nothing"
        self.api.log.append(("wait", self.name, ev, threading.current_thread().name))


class FakeCuda:
    """CuPy's ``cupy.cuda`` as ``PlanStreams`` uses it; streams named in creation order."""

    def __init__(self):
        self.log, self.current, self.made = [], threading.local(), []
        self.null = FakeStream(self, "legacy", False)

    def Stream(self, non_blocking=False):
        s = FakeStream(self, ("upload", "place")[len(self.made)], non_blocking)
        self.made.append(s)
        return s

    def get_current_stream(self):
        stack = getattr(self.current, "stack", [])
        return stack[-1] if stack else self.null


def _faked(be):
    api = FakeCuda()
    be.streams = PlanStreams(api)
    return api


def test_plan_streams_are_non_blocking_and_idle_without_cupy():
    api = FakeCuda()
    st = PlanStreams(api)
    assert [s.non_blocking for s in api.made] == [True, True] and (st.upload.name, st.place.name) == ("upload", "place")
    none = PlanStreams(None)  # NumPy arrays (the CPU, the simulator): nothing to order
    assert none.upload is none.place is None and none.record(None) is None
    none.wait(None), none.host_wait(None)


def test_index_dtype_is_the_smallest_that_holds_the_bound():
    assert [index_dtype(b) for b in (0, 255, 256, 65535, 65536, 2**32 - 1, 2**32)] == \
        [np.uint8, np.uint8, np.uint16, np.uint16, np.uint32, np.uint32, np.int64]


def test_device_path_prepare_place_train_order_their_streams_with_events():
    """upload: the copy and dedup on the upload stream, its event recorded then waited on the host;
    stage_uploaded: the place stream waits for it, then records the plans' event; begin_batch: the
    current (legacy) stream waits for that event on the device, without a host wait."""
    local = _local(3)
    be = _backend(2)
    api = _faked(be)
    seen = []
    upload = be.staging.upload
    be.staging.upload = lambda arrays, purpose, stream=None: seen.append((stream, api.get_current_stream())) \
        or upload(arrays, purpose, stream)
    raw = be.upload(local.data)
    assert seen == [(be.streams.upload, be.streams.upload)]
    assert [e[:2] for e in api.log] == [("record", "upload"), ("host_wait", None)]
    assert api.log[1][2] is raw.uploaded is api.log[0][2]
    staged = be.stage_uploaded(raw, local.bounds, None)  # one table: no locks to take
    assert [e[:2] for e in api.log[2:]] == [("wait", "place"), ("record", "place")]
    assert api.log[2][2] is raw.uploaded and staged.ready is api.log[3][2]
    del api.log[:]
    be.begin_batch(SimpleNamespace(device_view=lambda: _null()), staged)
    assert [e[:3] for e in api.log] == [("wait", "legacy", staged.ready)]  # once, no host wait


def test_host_path_plans_are_ready_after_the_place_streams_event():
    local = _local(5)
    plans = [Plan(*unique_inverse(local.minibatch(j).keys)) for j in range(len(local.bounds) - 1)]
    for p in plans:
        p.ukeys = p.keys
    be = _backend(2)
    api = _faked(be)
    staged = be.stage(local, plans, None)
    assert [e[:2] for e in api.log] == [("record", "place")] and staged.ready is api.log[0][2]
    assert be.ledger.metrics()["batch_bytes"] == raw_nbytes(local.data)
    be.begin_batch(SimpleNamespace(device_view=lambda: _null()), staged)
    assert api.log[-1][:3] == ("wait", "legacy", staged.ready)


def _null():
    import contextlib

    return contextlib.nullcontext()


def test_a_job_orders_every_batch_across_the_stage_threads(tmp_path, monkeypatch):
    """A whole (tiny) job in the pipeline's threads: every batch's upload event is recorded and host-
    waited in the prepare thread and waited by the place stream in the place thread; every place
    event is recorded in the place thread, then waited once by the train thread's legacy stream."""
    from hps.train import main

    apis = []

    def fake(xp):
        apis.append(FakeCuda())
        return apis[-1]

    monkeypatch.setattr(device_backend, "stream_api", fake)
    assert main([*TINY, "--device", "cuda", "--metrics-out", str(tmp_path / "m.json")]) == 0
    log = apis[0].log
    ups = [e for e in log if e[0] == "record" and e[1] == "upload"]
    places = [e for e in log if e[0] == "record" and e[1] == "place"]
    assert len(ups) == len(places) == 3 and {e[3] for e in ups} == {"prepare"} and {e[3] for e in places} == {"place"}
    for up, pl in zip(ups, places):
        waits = [(e[0], e[1], e[3]) for e in log if e[2] is up[2] and e[0] != "record"]
        assert waits == [("host_wait", None, "prepare"), ("wait", "place", "place")]
        assert log.index(up) < log.index(next(e for e in log if e[2] is up[2] and e[0] == "wait"))
        waits = [(e[0], e[1], e[3]) for e in log if e[2] is pl[2] and e[0] != "record"]
        assert waits == [("wait", "legacy", "train")]


class _Prod:
    """A device array's producer stream as Numba sees it (``DeviceNDArray.stream``)."""

    def __init__(self, handle):
        self.handle = handle

    def __int__(self):
        return self.handle


@pytest.mark.parametrize("producer,call,waits", [(0, 0, False), (_Prod(1), 0, False), (_Prod(77), 0, True),
                                                 (_Prod(77), _Prod(77), False), (_Prod(1), _Prod(88), True)])
def test_a_blocking_table_call_follows_its_inputs_producer_on_the_device(monkeypatch, producer, call, waits):
    """``hps.table._cuda_alloc.follow_producer``: an input exported on another stream than the call's
    is ordered by an event recorded on the producer's stream and waited on by the call's (no host
    wait; the event is the caller's, ``ev``); the same stream (the legacy default one is handle 1 and
    Numba's stream 0) or no producer stream needs nothing."""
    from hps.table import _cuda_alloc

    log = []

    class Ev:
        def record(self, s):
            log.append(("record", s))

        def wait(self, s):
            log.append(("wait", s))

    monkeypatch.setattr(_cuda_alloc.L, "event", lambda: pytest.fail("an event created per call"))
    _cuda_alloc.follow_producer(SimpleNamespace(stream=producer), call, Ev())
    assert log == ([("record", producer), ("wait", call)] if waits else [])


def test_a_device_callers_table_results_are_fresh_device_arrays():
    """Blocking calls on device keys return new device arrays (``DeviceAlloc``; Numba's allocator in
    the simulator) that the next call does not overwrite."""
    from numba import cuda

    from hps import HashTable

    t = HashTable(16, 2, device="cuda")
    keys = cuda.to_device(np.arange(1, 6, dtype=np.uint64))
    t.insert(keys, cuda.to_device(np.ones((5, 2), np.float32)))
    found = t.contains(keys)
    other = t.contains(cuda.to_device(np.arange(20, 25, dtype=np.uint64)))
    assert found.copy_to_host().all() and not other.copy_to_host().any()
    rows, hit = t.get(keys)
    assert (rows.copy_to_host() == 1).all() and hit.copy_to_host().all()


def _host_plans(local):
    plans = [Plan(*unique_inverse(local.minibatch(j).keys)) for j in range(len(local.bounds) - 1)]
    for p in plans:
        p.ukeys = p.keys
    return plans


def test_host_path_keys_go_up_as_positions_in_the_working_set_uploaded_once():
    """``upload_working_set`` sends the batch's working set once (8 B a key, kept for the residency
    lookup); ``stage`` sends each mini-batch's keys as their positions in it (1 B each here) and
    gathers them on the device after the upload's event; a key missing from it goes up as itself."""
    local = _local(11, n_dense=2)
    plans = _host_plans(local)
    resident = unique_inverse(np.concatenate([p.keys for p in plans]))[0]
    be = _backend(2)
    api = _faked(be)
    kept = []
    be.hbm = SimpleNamespace(keep=lambda k, d: kept.append((k, d)))
    ws = be.upload_working_set(resident)
    assert kept[0][0] is resident and np.array_equal(kept[0][1], resident)
    assert [e[:2] for e in api.log] == [("record", "upload"), ("host_wait", None)]
    plans[1].keys = plans[1].ukeys = np.concatenate([plans[1].keys, [np.uint64(12345)]])  # not in it
    staged = be.stage(local, plans, None, working_set=ws)
    assert [e[:3] for e in api.log[2:]] == [("wait", "place", ws.uploaded), ("record", "place", staged.ready)]
    want = 8 * resident.shape[0]
    for j, (p, d) in enumerate(zip(plans, staged)):
        b = local.minibatch(j)
        n, nnz = len(b), b.keys.shape[0]
        np.testing.assert_array_equal(d.keys, p.keys)
        want += (8 if j == 1 else 1) * p.keys.shape[0] + (1 + 1 + 4) * nnz + (n + 1) + 4 * n + 4 * n * 2
    assert be.ledger.metrics()["h2d_bytes"]["plan"] == want


def test_a_kept_working_set_is_looked_up_without_an_upload():
    """``LedgerTable.keep``: the residency lookup of the very array kept uploads nothing (only the
    misses come down); any other array still goes up."""
    from hps import HashTable
    from hps.gpu import TransferLedger
    from hps.train._device_rows import OneTable
    from hps.train._device_table import LedgerTable

    led = TransferLedger(np)
    t = LedgerTable(HashTable(16, 2, device="cuda"), led, OneTable(np, 2))
    t.insert(np.arange(1, 4, dtype=np.uint64), np.ones((3, 2), np.float32))
    up = led.metrics()["h2d_bytes"]["plan"]
    ws = np.arange(2, 7, dtype=np.uint64)
    t.keep(ws, ws.copy())
    np.testing.assert_array_equal(t.missing(ws, 1), [4, 5, 6])
    assert led.metrics()["h2d_bytes"]["plan"] == up and led.metrics()["d2h_bytes"]["plan"] == 3 * 8
    np.testing.assert_array_equal(t.missing(ws.copy(), 1), [4, 5, 6])
    assert led.metrics()["h2d_bytes"]["plan"] == up + ws.nbytes


def test_the_residency_lookup_selects_its_misses_with_the_table_unlocked():
    """``LedgerTable.missing`` launches the lookup under the table's lock and selects the misses (CuPy's
    count of them waits for the lookup, queued behind the train stage's kernels) after releasing it:
    meanwhile another thread (the train stage) takes the table's view and goes on launching."""
    from hps import HashTable
    from hps.gpu import TransferLedger
    from hps.train._device_rows import OneTable
    from hps.train._device_table import LedgerTable

    other_got_the_view = []

    class Watched(OneTable):
        def misses(self, looked):
            got = threading.Event()

            def train_stage():
                with t.device_view():
                    got.set()

            th = threading.Thread(target=train_stage)
            th.start()
            other_got_the_view.append(got.wait(10))
            th.join(10)
            return super().misses(looked)

    t = LedgerTable(HashTable(16, 2, device="cuda"), TransferLedger(np), Watched(np, 2))
    t.insert(np.arange(1, 4, dtype=np.uint64), np.ones((3, 2), np.float32))
    np.testing.assert_array_equal(t.missing(np.arange(2, 7, dtype=np.uint64), 1), [4, 5, 6])
    assert other_got_the_view == [True]


def test_parts_look_a_kept_working_set_up_on_the_device_and_its_misses_again_without_an_upload():
    """With HBM-PS parts (over 2 simulated GPUs) ``LedgerTable.missing`` of a kept working set
    partitions it on the device (its 3 counts come down) and looks each part's share up on the part's
    GPU: the misses and every key's use equal ``PartitionedHashTable.missing`` on host keys. Once the
    misses are inserted, their lookup (their first use) reuses their partition: nothing goes up, no
    count comes down."""
    from hps.gpu import PartitionedHashTable, Placement, TransferLedger
    from hps.train._device_rows import Parts
    from hps.train._device_table import LedgerTable

    led = TransferLedger(np)
    table, twin = (PartitionedHashTable(3, 64, 2, device="cuda", gpus=2) for _ in range(2))
    t = LedgerTable(table, led, Parts(np, 2, Placement(3, 2), led))
    old = np.arange(1, 13, dtype=np.uint64) * np.uint64(2**33 + 7)
    for x in (table, twin):
        x.insert(old, np.ones((12, 2), np.float32))
    ws = np.random.default_rng(0).permutation(np.concatenate([old[::2], old[-1] + np.arange(1, 8, dtype=np.uint64)]))
    t.keep(ws, ws.copy())
    miss = t.missing(ws, 1)
    np.testing.assert_array_equal(miss, twin.missing(ws, 1))
    assert miss.shape == (7,) and led.metrics()["h2d_bytes"]["plan"] == 0
    assert led.metrics()["d2h_bytes"]["plan"] == 8 * 7 + 8 * 3  # the misses and the parts' counts
    rows = np.full((7, 2), 2, np.float32)
    t.insert(miss, rows)
    twin.insert(miss, rows)
    assert t.missing(miss, 1).shape == (0,) and twin.missing(miss, 1).shape == (0,)
    assert led.metrics()["h2d_bytes"]["plan"] == 0 and led.metrics()["d2h_bytes"]["plan"] == 8 * 7 + 8 * 3
    for n in (3, 9):  # victims by (uses, last use, key): the same uses were counted
        got, want = table.evict(n, 2), twin.evict(n, 2)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def test_the_pinned_buffer_is_repacked_only_after_the_copy_that_read_it(monkeypatch):
    """``PinnedStaging`` on a GPU (CuPy stood in for): each copy records an event on its stream, and
    the next upload waits for that event before packing its arrays into the pinned buffer."""
    import sys

    from hps.gpu import PinnedStaging, TransferLedger

    log = []

    class Dev(np.ndarray):
        def set(self, host, stream=None):
            self[...] = host
            log.append(("copy", stream.name, bytes(host[:8])))

    class Ev:
        def __init__(self, n):
            self.n = n

        def synchronize(self):
            log.append(("sync", self.n, bytes(st._host[:8])))  # the buffer still holds that copy's bytes

    class Stream:
        name = "upload"

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def record(self):
            log.append(("record", len(log)))
            return Ev(len(log) - 1)

    stream = Stream()
    xp = SimpleNamespace(empty=lambda n, dt: np.empty(n, dt).view(Dev),
                         cuda=SimpleNamespace(get_current_stream=lambda: stream))
    monkeypatch.setitem(sys.modules, "cupyx", SimpleNamespace(empty_pinned=lambda shape, dt: np.empty(shape, dt)))
    st = PinnedStaging(xp, TransferLedger(np))
    a, b = np.arange(4, dtype=np.int64), np.arange(10, 14, dtype=np.int64)
    np.testing.assert_array_equal(st.upload([a], "plan", stream=stream)[0], a)
    np.testing.assert_array_equal(st.upload([b], "plan", stream=stream)[0], b)
    assert [e[0] for e in log] == ["copy", "record", "sync", "copy", "record"]
    assert log[2][1] == 1 and log[2][2] == a[:1].tobytes() and log[3][2] == b[:1].tobytes()


def test_a_ledger_table_refuses_rows_placed_unlike_its_table():
    """Whether the HBM-PS has parts is the table's: ``placed`` saying otherwise is refused at once (it
    used to build, and fail at the first residency lookup)."""
    from hps import HashTable
    from hps.errors import InvalidTypeError
    from hps.gpu import PartitionedHashTable, Placement, TransferLedger
    from hps.train._device_rows import OneTable, Parts
    from hps.train._device_table import LedgerTable

    led = TransferLedger(np)
    with pytest.raises(InvalidTypeError, match="Parts"):
        LedgerTable(PartitionedHashTable(3, 64, 2, device="cuda", gpus=2), led, OneTable(np, 2))
    with pytest.raises(InvalidTypeError, match="OneTable"):
        LedgerTable(HashTable(16, 2, device="cuda"), led, Parts(np, 2, Placement(3, 2), led))
