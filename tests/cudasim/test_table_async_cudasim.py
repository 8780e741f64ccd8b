"""The stream-aware CUDA table under the simulator: ``*_async`` calls on device arrays and streams, their
counts settled at the edge, the per-call launch count of lookups, and the sentinel in asynchronous
calls. (The simulator runs a stream's work at once; what it checks is the protocol, not overlap.)"""

import numpy as np
import pytest

from hps import HashTable, _launch
from hps.errors import HashTableFullError, InvalidInputError

pytestmark = pytest.mark.cudasim


def cuda():
    from numba import cuda as c

    return c


def dev(a):
    return cuda().to_device(np.ascontiguousarray(a))


def test_async_calls_on_two_streams_match_the_blocking_ones():
    c = cuda()
    s1, s2 = c.stream(), c.stream()
    t = HashTable(64, 3, device="cuda")
    keys = np.arange(1, 21, dtype=np.uint64) * np.uint64(977)
    rows = np.arange(60, dtype=np.float32).reshape(20, 3)
    t.insert_async(dev(keys), dev(rows), stream=s1)
    t.accumulate_async(dev(keys[:5]), dev(np.ones((5, 3), np.float32)), stream=s2)
    out, found = c.device_array((22, 3), np.float32), c.device_array(22, np.bool_)
    probe = np.concatenate([keys, np.array([5, 6], np.uint64)])
    t.get_async(dev(probe), out, found, stream=s1)
    t.erase_async(dev(keys[10:]), stream=s2)
    live = c.device_array(22, np.bool_)
    t.contains_async(dev(probe), live, stream=s1)
    assert t._maybe_new == 25 and t._maybe_erased == 10  # nothing settled yet
    assert len(t) == 10  # settles: 20 new, 10 erased
    want = rows.copy()
    want[:5] += 1
    np.testing.assert_array_equal(out.copy_to_host()[:20], want)
    assert found.copy_to_host().tolist() == [True] * 20 + [False, False]
    assert live.copy_to_host().tolist() == [True] * 10 + [False] * 12
    assert t._tombstones == 10
    v, f = t.get(keys)
    assert f.tolist() == [True] * 10 + [False] * 10


def test_async_calls_keep_issue_order_across_streams(monkeypatch):
    """(NumPy arrays stand for device arrays under the simulator, as in hps.gpu's operations; a real
    GPU refuses host arrays in asynchronous calls: tests/gpu/test_table_gpu.py.) The table makes its
    one ordering event when it is built, none per call."""
    c = cuda()
    waits, made = [], []
    real = _launch.event

    def spy():
        ev = real()
        orig = ev.wait
        ev.wait = lambda s=0: (waits.append(s), orig(s))
        made.append(ev)
        return ev

    monkeypatch.setattr(_launch, "event", spy)
    t = HashTable(8, 2, device="cuda")
    s = c.stream()
    t.contains_async(dev(np.array([1], np.uint64)), c.device_array(1, np.bool_), stream=s)  # 0 -> s: waits
    t.contains_async(dev(np.array([1], np.uint64)), c.device_array(1, np.bool_), stream=s)  # same stream
    t.contains(np.array([1], np.uint64))  # s -> 0: waits again
    assert waits == [s, 0] and len(made) == 1


def test_sentinel_in_an_async_insert_is_skipped_and_reported_at_the_edge():
    t = HashTable(8, 1, device="cuda")
    keys = np.array([4, 2**64 - 1, 5], np.uint64)
    t.insert_async(dev(keys), dev(np.ones((3, 1), np.float32)))
    with pytest.raises(InvalidInputError, match="sentinel"):
        t.synchronize()
    assert len(t) == 2 and t.contains(np.array([4, 5], np.uint64)).all()
    found = cuda().device_array(3, np.bool_)
    t.contains_async(dev(keys), found)  # lookups answer the sentinel absent
    assert found.copy_to_host().tolist() == [True, False, True]
    with pytest.raises(InvalidInputError, match="sentinel"):
        t.contains(dev(keys))  # blocking lookups raise


def test_async_insert_that_might_not_fit_blocks_and_a_full_table_changes_nothing():
    t = HashTable(4, 1, device="cuda")
    t.insert_async(dev(np.array([1, 2, 3], np.uint64)), dev(np.ones((3, 1), np.float32)))
    t.insert_async(dev(np.array([1, 2], np.uint64)), dev(np.full((2, 1), 2, np.float32)))  # settles, fits
    assert len(t) == 3
    before = t.export()
    with pytest.raises(HashTableFullError):
        t.insert_async(dev(np.array([7, 8], np.uint64)), dev(np.ones((2, 1), np.float32)))
    after = t.export()
    assert sorted(after[0].tolist()) == sorted(before[0].tolist()) == [1, 2, 3]


def test_a_lookup_is_one_launch_and_one_read(monkeypatch):
    """Per-call work of a blocking lookup on device keys: the lookup kernel (which also flags the
    sentinel) and one 8-byte read; no separate sentinel pass, no device-wide synchronisation."""
    t = HashTable(64, 2, device="cuda")
    t.insert(np.arange(10, dtype=np.uint64), np.ones((10, 2)))
    keys = dev(np.arange(20, dtype=np.uint64))
    launched = []
    real = _launch.launch
    monkeypatch.setattr(_launch, "launch", lambda k, *a: (launched.append(k.__name__ if hasattr(k, "__name__")
                                                                            else str(k)), real(k, *a)))
    monkeypatch.setattr(cuda(), "synchronize", lambda: pytest.fail("device-wide synchronize"))
    found = t.contains(keys)
    assert len(launched) == 1 and found.copy_to_host().sum() == 10
    t.get(keys)
    assert len(launched) == 2
