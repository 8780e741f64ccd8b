"""HashTable(device="cuda") on a real GPU (skips itself without one): large random batches against
the CPU backend, real atomics under contention, and zero-copy device inputs/outputs."""

import numpy as np
import pytest

from hps import HashTable
from hps.errors import HashTableFullError

pytestmark = pytest.mark.gpu

N = 1 << 16


def cuda():
    from numba import cuda as c

    return c


def sorted_export(table):
    k, v = table.export()
    o = np.argsort(k)
    return k[o], v[o]


def assert_same(gpu, cpu):
    assert len(gpu) == len(cpu)
    gk, gv = sorted_export(gpu)
    ck, cv = sorted_export(cpu)
    np.testing.assert_array_equal(gk, ck)
    np.testing.assert_array_equal(gv, cv)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_large_random_sequence_matches_cpu(dtype):
    rng = np.random.default_rng(7)
    dim = 32
    pool = rng.integers(0, 2**64 - 1, 3 * N // 2, dtype=np.uint64)  # never the sentinel
    pool[:2] = [0, 2**64 - 2]
    gpu = HashTable(N, dim, device="cuda", dtype=dtype)
    cpu = HashTable(N, dim, device="cpu", dtype=dtype)

    def batch(n):  # duplicates are frequent: n keys drawn from 1.5 N
        k = pool[rng.integers(0, pool.shape[0], n)]
        return k, rng.integers(-8, 8, (n, dim)).astype(dtype)  # integer-valued: exact float sums

    def both(op, *args):
        out_g = getattr(gpu, op)(*args)
        out_c = getattr(cpu, op)(*args)
        return out_g, out_c

    both("insert", *batch(N // 2))                 # duplicates: the last occurrence must win
    both("accumulate", *batch(N // 2))             # duplicates add up (atomics)
    assert_same(gpu, cpu)
    k, _ = batch(N // 4)
    n_g, n_c = both("erase", k)
    assert n_g == n_c
    both("insert", *batch(N // 4))                 # revives some tombstones
    both("accumulate", *batch(N // 8))
    probe = np.concatenate([batch(N // 2)[0], rng.integers(0, 2**63, 1000, dtype=np.uint64)])
    (vg, fg), (vc, fc) = both("get", probe)
    np.testing.assert_array_equal(fg, fc)
    np.testing.assert_array_equal(vg, vc)
    np.testing.assert_array_equal(gpu.contains(probe), cpu.contains(probe))
    assert_same(gpu, cpu)
    # overflow through the claim/commit path: nothing changes
    before = sorted_export(gpu)
    room = N - len(gpu)
    new = rng.integers(2**63, 2**64 - 1, room + 10, dtype=np.uint64)
    with pytest.raises(HashTableFullError):
        gpu.insert(new, np.ones((new.shape[0], dim), dtype))
    after = sorted_export(gpu)
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    gpu.insert(new[:room], np.ones((room, dim), dtype))  # exactly to capacity
    assert len(gpu) == N
    gpu.clear()
    assert len(gpu) == 0 and not gpu.contains(probe).any()


def test_duplicate_heavy_insert_last_wins():
    """Thousands of threads write the same few keys at once; only the last occurrence may land."""
    u, reps, dim = 64, 1024, 16
    keys = np.tile(np.arange(u, dtype=np.uint64), reps)
    rows = np.repeat(np.arange(keys.shape[0], dtype=np.float32)[:, None], dim, axis=1)
    gpu = HashTable(u, dim, device="cuda")
    gpu.insert(keys, rows)
    v, f = gpu.get(np.arange(u, dtype=np.uint64))
    last = (reps - 1) * u + np.arange(u)
    assert f.all()
    np.testing.assert_array_equal(v, np.repeat(last.astype(np.float32)[:, None], dim, axis=1))


def test_contention_closed_form():
    """N copies of each of U keys accumulate integer deltas: every value is N/U * delta, exactly."""
    n, u, dim = 1 << 20, 64, 8
    keys = np.tile(np.arange(u, dtype=np.uint64), n // u)
    np.random.default_rng(0).shuffle(keys)
    table = HashTable(u, dim, device="cuda")
    c = cuda()
    table.accumulate(c.to_device(keys), c.to_device(np.full((n, dim), 3.0, np.float32)))
    v, f = table.get(np.arange(u, dtype=np.uint64))
    assert f.all() and len(table) == u
    assert (v == 3.0 * n / u).all()


def test_numba_device_inputs_are_zero_copy_and_results_stay_on_device():
    c = cuda()
    dim = 8
    table = HashTable(N, dim, device="cuda")
    keys = np.random.default_rng(3).permutation(N).astype(np.uint64)
    d_keys = c.to_device(keys)
    d_rows = c.to_device(np.ones((N, dim), np.float32))
    k, on_dev = table._impl.keys_in(d_keys)
    assert on_dev and k.device_ctypes_pointer.value == d_keys.device_ctypes_pointer.value
    r = table._impl.rows_in(d_rows, N)
    assert r.device_ctypes_pointer.value == d_rows.device_ctypes_pointer.value
    table.insert(d_keys, d_rows)
    v, f = table.get(d_keys)
    assert hasattr(v, "__cuda_array_interface__") and hasattr(f, "__cuda_array_interface__")
    assert f.copy_to_host().all() and (v.copy_to_host() == 1).all()


def test_cupy_inputs():
    cp = pytest.importorskip("cupy")
    dim = 16
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 2**63, N, dtype=np.uint64)
    rows = rng.integers(-4, 4, (N, dim)).astype(np.float32)
    gpu = HashTable(N, dim, device="cuda")
    cpu = HashTable(N, dim, device="cpu")
    ck = cp.asarray(keys.view(np.int64))  # int64 device keys are reinterpreted bitwise
    gpu.insert(ck, cp.asarray(rows))
    cpu.insert(keys, rows)
    k, _ = gpu._impl.keys_in(ck)
    assert k.device_ctypes_pointer.value == ck.data.ptr  # zero-copy
    v, f = gpu.get(cp.asarray(keys))
    v, f = cp.asarray(v), cp.asarray(f)  # results are device arrays: wrap without a copy
    np.testing.assert_array_equal(cp.asnumpy(v), cpu.get(keys)[0])
    assert bool(f.all())
    # strided device views (non-contiguous layouts) work too
    sk, sr = cp.asarray(keys)[::2], cp.asarray(np.hstack([rows, rows]))[::2, ::2]
    gpu.accumulate(sk, sr)
    cpu.accumulate(keys[::2], np.hstack([rows, rows])[::2, ::2])
    assert_same(gpu, cpu)
    with pytest.raises(ValueError, match="sentinel"):
        gpu.get(cp.asarray(np.array([1, -1], np.int64)))


def test_the_sentinel_flag_of_blocking_lookups_on_a_gpu():
    """``hit`` is mapped host memory (``hps/table/_cuda.py``): a blocking lookup of the sentinel raises
    (get and contains), the next lookups answer and do not raise, and an asynchronous lookup of the
    sentinel (answered absent) does not make the next blocking one raise."""
    cp = pytest.importorskip("cupy")
    t = HashTable(64, 4, device="cuda")
    keys = cp.arange(1, 9, dtype=cp.uint64)
    t.insert(keys, cp.ones((8, 4), cp.float32))
    bad, out = cp.asarray(np.array([3, 2**64 - 1], np.uint64)), cp.zeros((8, 4), cp.float32)
    for lookup in (lambda k: t.get(k), t.contains) * 2:
        with pytest.raises(ValueError, match="sentinel"):
            lookup(bad)
        assert bool(cp.asarray(t.contains(keys)).all())
    found = cp.zeros(2, cp.bool_)
    t.contains_async(bad, found)
    _, f = t.get(keys, out=out)
    assert bool(cp.asarray(f).all()) and bool((out == 1).all()) and found.tolist() == [True, False]


def test_partitioned_cuda_matches_single_cpu():
    from hps.gpu import PartitionedHashTable

    rng = np.random.default_rng(11)
    keys = rng.integers(0, 2**63, N // 4, dtype=np.uint64)
    deltas = rng.integers(-4, 4, (N // 4, 8)).astype(np.float32)
    parted, single = PartitionedHashTable(3, N, 8, device="cuda"), HashTable(N, 8)
    for t in (parted, single):
        t.accumulate(keys, deltas)
        t.insert(keys[::5], deltas[::5])
    np.testing.assert_array_equal(parted.get(keys)[0], single.get(keys)[0])
    assert len(parted) == len(single)


def test_evictions_come_back_as_on_the_cpu_in_key_order():
    """``evict`` on the GPU (its victims sorted by key on the device when CuPy is installed, else on the
    host) against the CPU table: the same victims and rows, in ascending key order, round after round."""
    rng = np.random.default_rng(5)
    n, dim = N * 2, 16
    keys = np.unique(rng.integers(0, 2**63, n, dtype=np.uint64))
    rows = rng.standard_normal((keys.shape[0], dim)).astype(np.float32)
    gpu, cpu = HashTable(2 * n, dim, device="cuda"), HashTable(2 * n, dim)
    for t in (gpu, cpu):
        t.insert(keys, rows)
    for batch in range(1, 6):
        used = keys[rng.random(keys.shape[0]) < 0.3]
        for t in (gpu, cpu):
            t.lookup(used, batch)
        gk, gr = gpu.evict(n // 8, protect_from=batch)
        ck, cr = cpu.evict(n // 8, protect_from=batch)
        assert gk.shape[0] == n // 8 and bool((gk[1:] > gk[:-1]).all())
        np.testing.assert_array_equal(gk, ck)
        np.testing.assert_array_equal(gr, cr)
    assert_same(gpu, cpu)


def test_async_calls_take_device_arrays_only():
    """Asynchronous calls enqueue and return: a host array would need a copy behind the caller's back."""
    from numba import cuda

    from hps.errors import InvalidTypeError

    t = HashTable(8, 2, device="cuda")
    with pytest.raises(InvalidTypeError, match="device array"):
        t.insert_async(np.array([1], np.uint64), cuda.to_device(np.ones((1, 2), np.float32)))
    with pytest.raises(InvalidTypeError, match="device array"):
        t.get_async(cuda.to_device(np.array([1], np.uint64)), np.zeros((1, 2), np.float32),
                    cuda.device_array(1, np.bool_))
