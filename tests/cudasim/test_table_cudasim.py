"""HashTable(device="cuda") under Numba's CUDA simulator, against the CPU backend and the dict model.

Run in its own process: ``NUMBA_ENABLE_CUDASIM=1 pytest tests/cudasim -q`` (the conftest skips these
tests otherwise). Sizes are tiny (the simulator runs every thread in Python) and the launch block
is patched to 16 threads and 3 blocks (``conftest.py``), so even tiny batches span several blocks and
every grid-stride loop runs several rounds.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hps import HashTable
from hps.errors import DeviceUnavailableError, HashTableFullError, InvalidInputError, InvalidTypeError
from hps.gpu import PartitionedHashTable
from tests.reference.table import DictTable

pytestmark = pytest.mark.cudasim

SENTINEL = 2**64 - 1
# a small universe makes duplicates, revivals and collisions likely; includes the edge keys
UNIVERSE = [0, 1, 2, 3, 5, 8, 13, 2**63, 2**64 - 2, 12345678901234567890] + list(range(100, 130))
DIM = 3


def cuda():
    from numba import cuda as c

    return c


def keys_of(idx):
    return np.array([UNIVERSE[i] for i in idx], dtype=np.uint64)


def sorted_export(table):
    k, v = table.export()
    o = np.argsort(k)
    return k[o], v[o]


def assert_same_state(gpu, cpu, model):
    assert len(gpu) == len(cpu) == len(model)
    gk, gv = sorted_export(gpu)
    ck, cv = sorted_export(cpu)
    mk, mv = model.export()
    np.testing.assert_array_equal(gk, mk)
    np.testing.assert_array_equal(ck, mk)
    np.testing.assert_array_equal(gv, mv)
    np.testing.assert_array_equal(cv, mv)
    for t in (gpu, cpu):  # the keys export lists, without the rows
        np.testing.assert_array_equal(np.sort(t.live_keys()), mk)


ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "accumulate", "get", "contains", "erase", "export", "clear", "reserve",
                         "purge"]),
        st.lists(st.integers(0, len(UNIVERSE) - 1), max_size=20),
        st.integers(0, 2**31),
    ),
    max_size=12,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seq=ops, capacity=st.integers(1, 24), dtype=st.sampled_from([np.float32, np.float64]),
       partitioned=st.booleans())
def test_random_sequences_match_cpu_and_dict(seq, capacity, dtype, partitioned):
    if partitioned:  # Algorithm 2 over CUDA parts (all on the one simulated device)
        gpu = PartitionedHashTable(2, capacity, DIM, device="cuda", dtype=dtype, part_capacity=capacity)
    else:
        gpu = HashTable(capacity, DIM, device="cuda", dtype=dtype)
    cpu = HashTable(capacity, DIM, device="cpu", dtype=dtype)
    model = DictTable(capacity, DIM, dtype)
    for op, idx, seed in seq:
        keys = keys_of(idx)
        # integer-valued rows keep float sums exact, so the order of atomic additions cannot matter
        rows = np.random.default_rng(seed).integers(-8, 8, (len(keys), DIM)).astype(dtype)
        if op in ("insert", "accumulate"):
            try:
                getattr(model, op)(keys, rows)
            except HashTableFullError:
                for t in (gpu, cpu):
                    with pytest.raises(HashTableFullError):
                        getattr(t, op)(keys, rows)
            else:
                getattr(gpu, op)(keys, rows)
                getattr(cpu, op)(keys, rows)
        elif op == "get":
            mv, mf = model.get(keys)
            for t in (gpu, cpu):
                v, f = t.get(keys)
                assert isinstance(v, np.ndarray) and v.dtype == np.dtype(dtype)
                np.testing.assert_array_equal(f, mf)
                np.testing.assert_array_equal(v, mv)
        elif op == "contains":
            mf = model.contains(keys)
            np.testing.assert_array_equal(gpu.contains(keys), mf)
            np.testing.assert_array_equal(cpu.contains(keys), mf)
        elif op == "erase":
            n = model.erase(keys)
            assert gpu.erase(keys) == n
            assert cpu.erase(keys) == n
        elif op == "clear":
            for t in (gpu, cpu, model):
                t.clear()
        elif op in ("reserve", "purge"):
            args = (seed % 32 + 1,) if op == "reserve" else ()
            for t in (gpu, cpu, model):
                getattr(t, op)(*args)
        assert_same_state(gpu, cpu, model)


def test_contention_closed_form():
    """N copies of each of U keys accumulate integer deltas: every value is N/U * delta, exactly."""
    n, u, dim = 192, 6, 2
    table = HashTable(u, dim, device="cuda")
    keys = np.tile(np.arange(u, dtype=np.uint64) * np.uint64(1 << 40), n // u)
    np.random.default_rng(0).shuffle(keys)
    deltas = np.repeat((keys >> np.uint64(40)).astype(np.float32)[:, None] + 1, dim, axis=1)
    table.accumulate(keys, deltas)
    ukeys = np.arange(u, dtype=np.uint64) * np.uint64(1 << 40)
    v, f = table.get(ukeys)
    assert f.all() and len(table) == u
    expect = (np.arange(u, dtype=np.float32)[:, None] + 1) * (n // u)
    np.testing.assert_array_equal(v, np.repeat(expect, dim, axis=1))


def test_contention_closed_form_device_inputs_two_phase():
    """Same, through the claim/commit path (batch larger than the capacity) with device inputs."""
    n, u, dim = 96, 4, 2
    table = HashTable(u, dim, device="cuda", dtype=np.float64)
    keys = np.tile(np.arange(u, dtype=np.uint64), n // u)
    np.random.default_rng(1).shuffle(keys)
    table.accumulate(cuda().to_device(keys), cuda().to_device(np.full((n, dim), 3.0)))
    v, f = table.get(np.arange(u, dtype=np.uint64))
    assert f.all() and (v == 3.0 * n / u).all()


@pytest.mark.parametrize("fill_first", [False, True], ids=["fast-path", "claim-path"])
def test_duplicates_in_one_insert_last_wins(fill_first):
    cap = 9 if fill_first else 40
    table = HashTable(cap, 1, device="cuda")
    if fill_first:  # leaves too little room for the fused path: goes through claim/commit
        table.insert(np.arange(100, 106, dtype=np.uint64), np.zeros((6, 1)))
    keys = np.array([7, 7, 3, 7, 9, 3, 7, 7, 9, 7], dtype=np.uint64)
    rows = np.arange(1, 11, dtype=np.float32)[:, None]
    table.insert(keys, rows)
    v, f = table.get(np.array([7, 3, 9], dtype=np.uint64))
    assert f.all() and v[:, 0].tolist() == [10.0, 6.0, 9.0]
    assert len(table) == 3 + (6 if fill_first else 0)
    # the owner scratch was reset: a second insert with fewer duplicates still lands
    table.insert(np.array([3, 7], dtype=np.uint64), np.array([[-1.0], [-2.0]]))
    assert table.get(np.array([7, 3], dtype=np.uint64))[0][:, 0].tolist() == [-2.0, -1.0]


def test_owner_scratch_marks_last_occurrence_and_is_reset():
    """The dedup protocol itself (the simulator runs threads in order, so a missing dedup could
    still pass the test above by luck; this checks the marks the row kernel relies on)."""
    from hps import _launch as L
    from hps.table import _cuda_kernels as K

    table = HashTable(40, 1, device="cuda")
    impl = table._impl
    keys = np.array([7, 7, 3, 7, 9, 3, 7, 7, 9, 7], dtype=np.uint64)
    table.insert(keys, np.arange(10, dtype=np.float32)[:, None])
    assert (impl.owner.copy_to_host() == -1).all()  # reset after every insert
    d_keys = cuda().to_device(keys[::-1].copy())  # 7 9 7 7 3 9 7 3 7 7: last 7 at 9, 9 at 5, 3 at 7
    impl._zero(impl.counts, 0)
    L.launch(K.upsert_claim, L.grid1(10), 0, impl.tkeys, impl.tstate, impl.owner, d_keys, True, impl.counts)
    owner = impl.owner.copy_to_host()
    tk = impl.tkeys.copy_to_host()
    marks = {int(tk[s]): int(owner[s]) for s in np.flatnonzero(owner >= 0)}
    assert marks == {7: 9, 9: 5, 3: 7}
    assert impl._read(impl.counts, 0)[:3].tolist() == [0, 0, 0]  # all three keys were already live
    L.launch(K.unmark_keys, L.grid1(10), 0, impl.tkeys, impl.owner, d_keys)
    assert (impl.owner.copy_to_host() == -1).all()


def test_edge_keys_and_int64_reinterpretation():
    table = HashTable(4, 2, device="cuda")
    table.insert(np.array([0, -2], dtype=np.int64), np.array([[1, 2], [3, 4]], np.float32))
    v, f = table.get(np.array([0, 2**64 - 2, 1], dtype=np.uint64))
    assert f.tolist() == [True, True, False]
    np.testing.assert_array_equal(v, [[1, 2], [3, 4], [0, 0]])


def test_fill_to_capacity_then_overflow_changes_nothing():
    cap, dim = 20, 2
    gpu = HashTable(cap, dim, device="cuda", max_load_factor=1.0)  # 32 slots, budget 20
    keys = np.arange(cap, dtype=np.uint64) * np.uint64(7919)
    gpu.insert(keys, np.ones((cap, dim)))
    assert len(gpu) == cap
    before = sorted_export(gpu)
    more = np.concatenate([keys[-5:], np.array([1, 2], dtype=np.uint64)])  # 5 present, 2 new
    with pytest.raises(HashTableFullError, match=f"capacity {cap}"):
        gpu.insert(more, np.full((7, dim), 9.0))
    with pytest.raises(HashTableFullError):
        gpu.accumulate(cuda().to_device(more), cuda().to_device(np.full((7, dim), 9.0, np.float32)))
    after = sorted_export(gpu)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert not gpu.contains(np.array([1, 2], dtype=np.uint64)).any()
    gpu.accumulate(keys[:4], np.ones((4, dim)))  # present keys only: fits at full capacity
    assert (gpu.get(keys[:4])[0] == 2).all()
    # erase then refill: tombstones are revived or purged, never leaked
    assert gpu.erase(keys[:10]) == 10
    gpu.insert(np.arange(1, 11, dtype=np.uint64), np.full((10, dim), 5.0))
    assert len(gpu) == cap and (gpu.get(np.arange(1, 11, dtype=np.uint64))[0] == 5).all()


def test_erase_zeroes_and_revived_key_starts_from_zero():
    table = HashTable(10, 2, device="cuda")
    k = np.array([42, 43], dtype=np.uint64)
    table.insert(k, np.full((2, 2), 5.0))
    assert table.erase(np.array([42, 42, 99], dtype=np.uint64)) == 1
    assert table.contains(k).tolist() == [False, True]
    table.accumulate(np.array([42], dtype=np.uint64), np.ones((1, 2)))
    np.testing.assert_array_equal(table.get(k)[0], [[1, 1], [5, 5]])


def test_empty_batches_are_noops():
    table = HashTable(10, 2, device="cuda")
    empty = np.empty(0, dtype=np.uint64)
    table.insert(empty, np.empty((0, 2)))
    table.accumulate(empty, np.empty((0, 2)))
    v, f = table.get(empty)
    assert v.shape == (0, 2) and f.shape == (0,)
    assert table.contains(empty).shape == (0,)
    assert table.erase(empty) == 0 and len(table) == 0
    k, v = table.export()
    assert k.shape == (0,) and v.shape == (0, 2)
    dv, df = table.get(cuda().to_device(empty))
    assert dv.shape == (0, 2) and df.shape == (0,)


def test_device_inputs_return_device_arrays():
    c = cuda()
    table = HashTable(16, 4, device="cuda")
    keys = np.array([5, 9, 5, 2**64 - 2], dtype=np.uint64)
    rows = np.arange(16, dtype=np.float32).reshape(4, 4)
    table.insert(c.to_device(keys.view(np.int64)), c.to_device(rows))  # int64 device keys too
    v, f = table.get(c.to_device(np.array([9, 5, 77], dtype=np.uint64)))
    assert c.is_cuda_array(v) if hasattr(c, "is_cuda_array") else getattr(v, "__cuda_ndarray__", False)
    assert getattr(f, "__cuda_ndarray__", False)
    np.testing.assert_array_equal(v.copy_to_host(), [rows[1], rows[2], np.zeros(4)])
    assert f.copy_to_host().tolist() == [True, True, False]
    m = table.contains(c.to_device(np.array([2**64 - 2, 1], dtype=np.uint64)))
    assert getattr(m, "__cuda_ndarray__", False) and m.copy_to_host().tolist() == [True, False]
    # host keys with device rows; device rows of another dtype are converted
    table.accumulate(np.array([9], dtype=np.uint64), c.to_device(np.ones((1, 4), dtype=np.int64)))
    v, _ = table.get(np.array([9], dtype=np.uint64))
    assert isinstance(v, np.ndarray)
    np.testing.assert_array_equal(v, rows[1:2] + 1)


@pytest.mark.parametrize("bad", [np.array([3, SENTINEL], np.uint64), np.array([-1], np.int64)])
def test_sentinel_key_rejected_host_and_device(bad):
    table = HashTable(10, 2, device="cuda")
    for keys in (bad, cuda().to_device(bad)):
        with pytest.raises(InvalidInputError, match="sentinel"):
            table.insert(keys, np.ones((len(bad), 2)))
        with pytest.raises(ValueError, match="2\\*\\*64-1"):
            table.get(keys)
    assert len(table) == 0


def test_bad_shapes_and_dtypes():
    c = cuda()
    table = HashTable(10, 2, device="cuda")
    k2 = np.arange(2, dtype=np.uint64)
    for wrap in (lambda a: a, c.to_device):
        with pytest.raises(InvalidInputError, match=r"shape \(2, 2\)"):
            table.insert(k2, wrap(np.ones((2, 3))))
        with pytest.raises(InvalidTypeError, match="uint64"):
            table.get(wrap(np.array([1.5])))
        with pytest.raises(InvalidInputError, match="1-D"):
            table.get(wrap(np.ones((2, 2), dtype=np.uint64)))
    with pytest.raises(InvalidTypeError, match="numeric"):
        table.insert(k2, c.to_device(np.ones((2, 2), dtype=np.complex64)))
    assert len(table) == 0


def test_export_clear_and_properties():
    table = HashTable(12, 3, device="cuda", dtype=np.float64)
    assert table.device == "cuda" and table.n_slots == 32 and table.dtype == np.float64
    keys = np.array([11, 22, 33], dtype=np.uint64)
    table.insert(keys, np.arange(9, dtype=np.float64).reshape(3, 3))
    k, v = sorted_export(table)
    assert k.tolist() == [11, 22, 33] and isinstance(v, np.ndarray)
    np.testing.assert_array_equal(v, np.arange(9).reshape(3, 3))
    table.clear()
    assert len(table) == 0 and not table.contains(keys).any()
    assert table.export()[0].shape == (0,)
    table.insert(keys[:1], np.ones((1, 3)))
    assert table.get(keys)[1].tolist() == [True, False, False]


def test_no_gpu_raises_device_unavailable(monkeypatch):
    monkeypatch.setattr(cuda(), "is_available", lambda: False)
    with pytest.raises(DeviceUnavailableError, match="no usable CUDA GPU"):
        HashTable(4, 2, device="cuda")


def test_get_into_caller_buffers():
    from numba import cuda

    t = HashTable(16, 3, device="cuda")
    t.insert(np.array([4, 5], np.uint64), np.ones((2, 3), np.float32))
    dev = cuda.device_array((2, 3), np.float32)
    vals, found = t.get(cuda.to_device(np.array([5, 6], np.uint64)), out=dev)
    assert vals.copy_to_host().tolist() == [[1, 1, 1], [0, 0, 0]]
    host = np.full((2, 3), 7, np.float32)
    vals, _ = t.get(np.array([6, 4], np.uint64), out=host)
    assert vals is host and host.tolist() == [[0, 0, 0], [1, 1, 1]]


def test_purge_and_growth_stay_on_the_device(monkeypatch):
    """A purge (explicit or inside an insert) and a reserve re-lay the entries with device kernels:
    no export and no copy of the slot arrays to the host."""
    table = HashTable(12, 2, device="cuda", max_load_factor=1.0)  # 16 slots, budget 12
    impl = table._impl

    def no_export(*a):
        raise AssertionError("export called")

    monkeypatch.setattr(impl, "export", no_export)
    keys = np.arange(12, dtype=np.uint64) * np.uint64(7919)
    rows = np.arange(24, dtype=np.float32).reshape(12, 2)
    table.insert(keys, rows)
    table.erase(keys[:8])
    slot_arrays = (impl.tkeys, impl.tstate, impl.tvals)
    for a in slot_arrays:
        monkeypatch.setattr(a, "copy_to_host", no_export, raising=False)
    new = np.arange(1, 9, dtype=np.uint64)
    table.insert(new, np.ones((8, 2)))  # 4 live + 8 tombstones + 8 > 12: the insert purges first
    assert table._tombstones == 0 and len(table) == 12
    table.erase(new[:4])
    table.purge()
    assert table._tombstones == 0
    table.reserve(40)  # 64 slots: new arrays, entries moved by kernels
    assert table.n_slots == 64 and impl.tkeys is not slot_arrays[0]
    table.insert(np.arange(100, 130, dtype=np.uint64), np.full((30, 2), 3.0))
    monkeypatch.undo()
    v, f = table.get(keys[8:])
    assert f.all()
    np.testing.assert_array_equal(v, rows[8:])
    assert (table.get(new[4:])[0] == 1).all() and len(table) == 38


def test_device_view_exposes_the_device_slot_arrays():
    table = HashTable(8, 2, device="cuda")
    table.insert(np.array([5, 6], np.uint64), np.ones((2, 2)))
    with table.device_view() as v:
        assert getattr(v.keys, "__cuda_ndarray__", False) and v.values.shape == (table.n_slots, 2)
        with pytest.raises(InvalidInputError, match="device_view"):
            table.purge()
