"""The device operations of one warm blocking CUDA table lookup, counted under the simulator with
CuPy-like inputs (``__cuda_array_interface__`` arrays that are not Numba's), so a change that adds a
copy, a synchronisation, an event or a conversion to ``get`` / ``contains`` fails here. Each counted
operation is a Numba CUDA call; on a GPU each looks the CUDA context up unless an outer call holds it,
so every one must run inside the call's one ``scope`` (``hps/table/_cuda_alloc.py``)."""

import collections

import numpy as np
import pytest

from hps import HashTable, _launch
from hps.errors import InvalidInputError
from hps.table._cuda import CudaTableImpl

pytestmark = pytest.mark.cudasim


class Cai:
    """A device array that is not Numba's (CuPy's stand-in), exported on the legacy default stream."""

    def __init__(self, a):
        self.a = np.ascontiguousarray(a)
        self.__cuda_array_interface__ = {"shape": self.a.shape, "typestr": self.a.dtype.str, "strides": None,
                                         "data": (self.a.ctypes.data, False), "version": 3, "stream": 1}


@pytest.fixture
def ops(monkeypatch):
    """Counter of the device operations made from now on; ``outside`` counts those made outside a scope."""
    from numba import cuda
    from numba.cuda.simulator import api
    from numba.cuda.simulator.cudadrv import devicearray as sim

    seen, depth = collections.Counter(), [0]

    def counted(obj, name, key):
        real = getattr(obj, name)

        def f(*a, **k):
            seen[key] += 1
            if depth[0] == 0:
                seen["outside"] += 1
            return real(*a, **k)
        monkeypatch.setattr(obj, name, f, raising=False)

    real_scope = CudaTableImpl.scope

    class Scope:
        def __enter__(self):
            seen["scope"] += 1
            depth[0] += 1
            self.inner = real_scope()
            return self.inner.__enter__()

        def __exit__(self, *exc):
            depth[0] -= 1
            return self.inner.__exit__(*exc)

    monkeypatch.setattr(CudaTableImpl, "scope", staticmethod(Scope))
    monkeypatch.setattr(cuda, "as_cuda_array", lambda x, sync=True: sim.FakeCUDAArray(x.a, stream=1), raising=False)
    for obj, name, key in ((cuda, "as_cuda_array", "convert"), (cuda, "device_array", "alloc"),
                           (cuda, "event", "event"), (api.Event, "record", "record"), (api.Event, "wait", "wait"),
                           (cuda, "default_stream", "default_stream"), (sim.FakeCUDAArray, "copy_to_device", "h2d"),
                           (sim.FakeCUDAArray, "copy_to_host", "d2h"), (api.stream, "synchronize", "sync"),
                           (cuda, "synchronize", "device_sync"), (_launch, "launch", "launch")):
        counted(obj, name, key)
    return seen


def _table():
    t = HashTable(64, 2, device="cuda")
    t.insert(np.arange(1, 11, dtype=np.uint64), np.ones((10, 2), np.float32))
    return t


def _once(ops, call):
    call()  # warm: scratch made, ``hit`` zeroed once
    ops.clear()
    return call(), dict(ops)


def test_a_blocking_lookup_is_one_launch_and_one_sync(ops):
    """get(keys, out=) converts keys and out, allocates found, launches once and synchronises its
    stream once: no copy either way (``hit`` is mapped host memory), no event, no default-stream
    object, all in one scope."""
    t = _table()
    keys, out = Cai(np.arange(1, 21, dtype=np.uint64)), Cai(np.zeros((20, 2), np.float32))
    (vals, found), n = _once(ops, lambda: t.get(keys, out=out))
    assert n == {"scope": 1, "convert": 2, "alloc": 1, "launch": 1, "sync": 1}
    assert found.copy_to_host().sum() == 10 and (out.a[:10] == 1).all() and not out.a[10:].any()
    found, n = _once(ops, lambda: t.contains(keys))
    assert n == {"scope": 1, "convert": 1, "alloc": 1, "launch": 1, "sync": 1}
    assert found.copy_to_host().sum() == 10
    slots, n = _once(ops, lambda: t.lookup(keys, 3))  # the HBM cache's per-batch lookup (``_cache.py``)
    assert n == {"scope": 1, "convert": 1, "alloc": 1, "launch": 1, "sync": 1}
    assert (slots.copy_to_host() >= 0).sum() == 10


def test_the_sentinel_flag_is_zeroed_only_after_a_lookup_that_may_have_set_it(ops):
    """A blocking lookup holding the sentinel raises; the next one waits for its stream, zeroes ``hit``
    on the host (two syncs, no copy) and answers; the one after it is back to one sync. Asynchronous
    lookups of the sentinel (answered absent, never raised) flag elsewhere: ``hit`` stays clean."""
    t = _table()
    bad, good = Cai(np.array([3, 2**64 - 1], np.uint64)), Cai(np.array([3, 4], np.uint64))
    for _ in range(2):
        with pytest.raises(InvalidInputError, match="sentinel"):
            t.contains(bad)
        ops.clear()
        assert t.contains(good).copy_to_host().all() and ops["sync"] == 2 and not ops["h2d"]
        ops.clear()
        assert t.contains(good).copy_to_host().all() and ops["sync"] == 1
    found, out = Cai(np.zeros(2, np.bool_)), Cai(np.zeros((2, 2), np.float32))
    t.contains_async(bad, found)
    t.get_async(bad, out, found)
    assert found.a.tolist() == [True, False] and t._impl.hit[0] == 0
    ops.clear()
    vals, got = t.get(good)
    assert got.copy_to_host().all() and ops["sync"] == 1
    with pytest.raises(InvalidInputError, match="sentinel"):
        t.get(bad, out=out)
