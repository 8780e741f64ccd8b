"""The CPU table's row lock (``hps/table/_rows.py``): the train step's ``find_rows``/``write_rows`` go on
while an eviction's sink or an insert's fill runs (the prepare stage's long calls), every other call
waits for them, the keys in transit answer absent, and a sink or fill that raises leaves the table
(keys, rows, scores) and the MEM-PS as they were."""

import threading
import time

import numpy as np
import pytest

from hps import HashTable
from hps.mem import MemPS, RowInitializer
from hps.train._collectives import Collectives
from hps.train._hierarchy import ParameterHierarchy
from tests.reference.store import DictStore

W = 4
WAIT = 10.0   # seconds a call that must not wait is given (it takes microseconds)


def _table(n=20):
    """Keys 1..n, row of key k = k in every column; keys 11..n used in batch 5 (protected from 5)."""
    t = HashTable(64, W)
    keys = np.arange(1, n + 1, dtype=np.uint64)
    t.insert(keys, np.repeat(keys.astype(np.float32)[:, None], W, 1))
    t.lookup(keys[10:], 5)
    return t, keys


class _Held:
    """A sink (``sink``) or a fill's hook (``run``) that signals it runs, keeps a copy of the rows it
    was handed and waits until released; then raises ``fail`` if given."""

    def __init__(self, fail=None):
        self.entered, self.release, self.fail, self.seen = threading.Event(), threading.Event(), fail, None

    def run(self, rows):
        self.seen = np.array(rows, copy=True)
        self.entered.set()
        assert self.release.wait(WAIT)
        if self.fail:
            raise self.fail

    def sink(self, keys, rows, at):
        self.run(rows[at])


def _start(fn, *args):
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", fn(*args)))
    th.start()
    return th, out


def _state(t):
    k, r = t.export()
    o = np.argsort(k)
    return k[o], r[o], t._impl.tscore[t._impl.tkeys != np.uint64(2**64 - 1)].copy()


def test_the_row_path_goes_on_while_a_sink_runs_and_other_calls_wait_for_it():
    t, keys = _table()
    sink = _Held()
    ev, ev_out = _start(t.evict_into, 5, 5, sink.sink)
    assert sink.entered.wait(WAIT)
    rows, slots = t.find_rows(keys)   # the main thread: it would hang if the row lock were held
    victims = keys[:5]
    assert (slots[:5] == -1).all() and (slots[5:] >= 0).all()      # the victims (1..5) are in transit
    np.testing.assert_array_equal(rows[5:, 0], keys[5:].astype(np.float32))
    t.write_rows(keys[10:], slots[10:], rows[10:] + 100)            # at their slots, no insert
    ins, _ = _start(t.insert, np.array([99], np.uint64), np.ones((1, W), np.float32))
    ins.join(0.2)
    assert ins.is_alive()                                           # a structural call waits
    sink.release.set()
    ev.join(WAIT), ins.join(WAIT)
    assert ev_out["r"].tolist() == victims.tolist()
    np.testing.assert_array_equal(sink.seen[:, 0], victims.astype(np.float32))
    assert len(t) == 16 and not t.contains(victims).any() and t.contains(np.array([99], np.uint64))[0]
    np.testing.assert_array_equal(t.get(keys[10:])[0][:, 0], keys[10:].astype(np.float32) + 100)


def test_write_rows_after_a_growth_finds_the_new_slots_without_waiting_for_a_sink():
    t, keys = _table()
    rows, slots = t.find_rows(keys[10:])
    t.reserve(1024)                       # re-laid: the slots found are stale
    assert (t.find_rows(keys[10:])[1] != slots).any()
    sink = _Held()
    ev, _ = _start(t.evict_into, 5, 5, sink.sink)
    assert sink.entered.wait(WAIT)
    t0 = time.monotonic()
    t.write_rows(keys[10:], slots, rows + 3)   # by insert it would wait for the sink: WAIT, which then fails
    assert time.monotonic() - t0 < WAIT / 2
    sink.release.set()
    ev.join(WAIT)
    np.testing.assert_array_equal(t.get(keys[10:])[0], rows + 3)


def test_write_rows_of_a_victim_during_the_sink_lands_after_the_eviction():
    t, keys = _table()
    rows, slots = t.find_rows(keys[:1])   # found live before the eviction
    sink = _Held()
    ev, _ = _start(t.evict_into, 1, 5, sink.sink)
    assert sink.entered.wait(WAIT)
    wr, _ = _start(t.write_rows, keys[:1], slots, rows + 7)
    wr.join(0.2)
    assert wr.is_alive()                  # its slot is stale: it goes through insert, which waits
    sink.release.set()
    ev.join(WAIT), wr.join(WAIT)
    assert len(t) == 20 and t.get(keys[:1])[0][0, 0] == 8.0   # evicted, then inserted again


@pytest.mark.parametrize("during", [False, True])
def test_a_sink_that_raises_leaves_keys_rows_and_scores_as_they_were(during):
    t, keys = _table()
    ref, _ = _table()
    before = _state(t)
    sink = _Held(fail=OSError("injected"))
    ev, _ = _start(lambda: pytest.raises(OSError, t.evict_into, 5, 5, sink.sink))
    assert sink.entered.wait(WAIT)
    if during:   # the row path meanwhile, on live keys
        rows, slots = t.find_rows(keys[10:])
        t.write_rows(keys[10:], slots, rows)
    sink.release.set()
    ev.join(WAIT)
    for a, b in zip(_state(t), before):
        np.testing.assert_array_equal(a, b)
    assert len(t) == 20 and t.find_rows(keys)[1].min() >= 0
    k1, r1 = t.evict(5, 5)
    k2, r2 = ref.evict(5, 5)                # the same victims as a table that never failed
    np.testing.assert_array_equal(k1, k2), np.testing.assert_array_equal(r1, r2)


@pytest.mark.parametrize("fail", [None, OSError("injected")])
def test_a_fill_runs_beside_the_row_path_and_a_failing_one_changes_nothing(fail):
    t, keys = _table()
    before = _state(t)
    new = np.arange(30, 36, dtype=np.uint64)

    def fill(out, at):
        out[at] = new.astype(np.float32)[:, None]
        held.run(out[at])

    held = _Held(fail=fail)
    call = (lambda: pytest.raises(OSError, t.insert_new, new, fill, 6)) if fail else (lambda: t.insert_new(new, fill, 6))
    th, _ = _start(call)
    assert held.entered.wait(WAIT)
    rows, slots = t.find_rows(np.r_[keys, new])
    assert (slots[:20] >= 0).all() and (slots[20:] == -1).all()   # the new keys are not in yet
    t.write_rows(keys, slots[:20], rows[:20])
    held.release.set()
    th.join(WAIT)
    if fail:
        for a, b in zip(_state(t), before):
            np.testing.assert_array_equal(a, b)
        t.insert_new(new, lambda out, at: None, 6)   # the keys were given back
    else:
        assert len(t) == 26
        np.testing.assert_array_equal(t.get(new)[0][:, 0], new.astype(np.float32))


def test_row_updates_and_evictions_on_two_threads_lose_nothing_and_tear_no_row():
    """The train step's pattern: read-modify-write of protected keys on one thread while another
    looks up, evicts and inserts the others (sinks that read rows, fills that write them)."""
    t = HashTable(512, W)   # grows (reserve) on the way: the re-lay makes the step's slots stale
    hot = np.arange(1, 257, dtype=np.uint64)
    t.insert(hot, np.zeros((256, W), np.float32))
    stop, steps = threading.Event(), [0]

    def train():
        while not stop.is_set():
            rows, slots = t.find_rows(hot)
            t.write_rows(hot, slots, rows + 1)
            steps[0] += 1

    th = threading.Thread(target=train)
    th.start()
    torn = []

    def sink(k, rows, at):   # a cold key's row is its key in every column, never a hot row
        r = rows[at]
        torn.append(int((r != k.astype(np.float32)[:, None]).sum()))

    nxt = 1000
    for b in range(1, 60):
        t.lookup(hot, b + 1000)
        cold = np.arange(nxt, nxt + 200, dtype=np.uint64)
        nxt += 200
        if len(t) + 200 > t.capacity:
            t.reserve(2 * t.capacity)
        t.insert_new(cold, lambda out, at, c=cold: out.__setitem__(at, c.astype(np.float32)[:, None]), b)
        if len(t) > 1500:
            t.evict_into(len(t) - 1000, b + 1000, sink)
    stop.set()
    th.join(WAIT)
    assert steps[0] > 0 and torn and sum(torn) == 0 and t.capacity >= 1024
    np.testing.assert_array_equal(t.get(hot)[0], np.full((256, W), steps[0], np.float32))


def test_a_mem_ps_push_that_raises_leaves_both_tiers_as_they_were_and_prepare_retries():
    mem = MemPS(DictStore(W), W, initializer=RowInitializer(2, W, seed=0), capacity_rows=256)
    hier = ParameterHierarchy(HashTable(64, W), mem, window=1, owned_mask=Collectives().owned_mask,
                              budget_rows=32)
    hier.prepare(0, np.arange(1, 31, dtype=np.uint64))
    hier.hbm.accumulate(np.arange(1, 31, dtype=np.uint64), np.ones((30, W), np.float32))
    hier.mark_trained(0)
    before, cached = _state(hier.hbm), len(mem.cache)
    push, calls = mem.push, []

    def failing(*a, **k):
        calls.append(1)
        raise OSError("injected push failure")

    mem.push = failing
    with pytest.raises(OSError, match="injected"):
        hier.prepare(1, np.arange(31, 51, dtype=np.uint64))   # 18 of batch 0's rows must leave
    assert calls and len(mem.cache) == cached
    for a, b in zip(_state(hier.hbm), before):
        np.testing.assert_array_equal(a, b)
    mem.push = push
    hier.prepare(1, np.arange(31, 51, dtype=np.uint64))
    keys = np.arange(1, 51, dtype=np.uint64)
    got = hier.read_owned(keys)
    np.testing.assert_array_equal(got[:30], mem.initializer(keys[:30]) + 1)   # nothing lost
