import threading
import time

import pytest

from hps.errors import PipelineError
from hps.pipeline import Pipeline, Stage


def test_items_flow_in_order_through_all_stages():
    out = []
    p = Pipeline("read", range(20), [Stage("a", lambda x: x + 1), Stage("b", lambda x: x * 2)], depth=2)
    p.run(out.append)
    assert out == [(x + 1) * 2 for x in range(20)]
    assert p.stage_times()["a"].items == 20


def test_stages_overlap():
    """Two 50 ms stages over 8 items take ~ 9 x 50 ms pipelined, not 16 x 50 ms serial."""
    def slow(x):
        time.sleep(0.05)
        return x

    p = Pipeline("read", range(8), [Stage("a", slow), Stage("b", slow)], depth=1)
    t = time.perf_counter()
    p.run()
    assert time.perf_counter() - t < 0.7


def test_bottleneck_is_the_busiest_stage():
    p = Pipeline("read", range(5), [Stage("fast", lambda x: x), Stage("slow", lambda x: time.sleep(0.02))])
    p.run()
    assert p.bottleneck() == "slow"
    assert "bottleneck: slow" in p.report()


@pytest.mark.parametrize("where", ["read", "a", "b", "sink"])
def test_failure_anywhere_stops_everything_with_its_error(where):
    def source():
        for i in range(1000):
            if where == "read" and i == 3:
                raise KeyError("bad line")
            yield i

    def boom(name):
        def f(x):
            if where == name and x == 5:
                raise ValueError(f"boom in {name}")
            return x
        return f

    def sink(x):
        if where == "sink" and x == 7:
            raise RuntimeError("sink broke")

    p = Pipeline("read", source(), [Stage("a", boom("a")), Stage("b", boom("b"))], depth=1)
    t = time.perf_counter()
    with pytest.raises(PipelineError) as ei:
        p.run(sink)
    assert ei.value.stage == where
    assert ei.value.__cause__ is not None and ei.value.__cause__.__traceback__ is not None
    assert time.perf_counter() - t < 5
    assert not any(th.name in ("a", "b") and th.is_alive() for th in threading.enumerate())


class _Stop(KeyboardInterrupt):
    """What a signal handler raises (Ctrl-C is KeyboardInterrupt itself)."""


@pytest.mark.parametrize("exc", [KeyboardInterrupt, _Stop])
def test_an_interrupt_of_the_caller_stops_every_stage_and_passes_through(exc):
    def sink(x):
        if x == 3:
            raise exc()

    p = Pipeline("read", iter(range(10**9)), [Stage("a", lambda x: x), Stage("b", lambda x: x)], depth=1)
    with pytest.raises(exc) as ei:
        p.run(sink)
    assert type(ei.value) is exc  # not wrapped in a PipelineError
    assert p.stop_event.is_set()
    assert not any(th.name in ("read", "a", "b") and th.is_alive() for th in threading.enumerate())


def test_stopping_waits_at_most_stop_timeout_for_a_stuck_stage():
    """A stage blocked for good (e.g. in a collective its peers never join) does not hold up the stop."""
    release = threading.Event()

    def stuck(x):
        if x == 1:
            release.wait(30)
        return x

    def sink(x):
        time.sleep(0.1)  # item 1 is in the stuck stage by then
        raise KeyboardInterrupt

    p = Pipeline("read", iter(range(100)), [Stage("stuck", stuck), Stage("b", lambda x: x)], depth=1,
                 stop_timeout_s=0.5)
    t = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        p.run(sink)
    assert time.perf_counter() - t < 5
    release.set()


def test_an_item_whose_gate_returns_because_the_pipeline_stops_is_not_processed():
    """A gate waits for a resource (prepare(i) waits for train(i - 3)) and returns early when the
    pipeline stops; the stage must not then run on the item (it would evict rows still in use)."""
    ran = []

    def gate(x):
        if x == 2:
            p.stop_event.wait(30)  # the resource never frees: only the stop releases the gate

    def sink(x):
        if x == 1:
            time.sleep(0.1)  # item 2 waits in the gate by then
            raise KeyboardInterrupt

    p = Pipeline("read", iter(range(100)), [Stage("gated", lambda x: ran.append(x) or x, gate=gate)], depth=1)
    with pytest.raises(KeyboardInterrupt):
        p.run(sink)
    assert 2 not in ran


def test_after_an_interrupt_a_stage_waiting_on_its_peers_is_left_after_the_grace():
    """An interrupted MPI job: stage "b" waits in a collective its stopped peers never join while the
    source is busy reading the next item. Stopping waits for the source (its work ends) but not for
    "b" beyond INTERRUPT_GRACE_S (it took stop_timeout_s); what "b" raises later is not reported."""
    from hps.pipeline import INTERRUPT_GRACE_S

    release, failed, finished = threading.Event(), [], []
    in_collective = {"b": False}

    def source():
        yield 0
        yield 1
        time.sleep(2 * INTERRUPT_GRACE_S + 0.1)  # reading item 2 when the interrupt comes
        finished.append(2)
        yield 2

    def b(x):
        if x == 1:
            in_collective["b"] = True
            release.wait(30)
            raise RuntimeError("the communicator was freed under this thread")
        return x

    def sink(x):
        time.sleep(0.1)  # item 1 is in "b" by then
        raise KeyboardInterrupt

    p = Pipeline("read", source(), [Stage("b", b)], depth=1, stop_timeout_s=20,
                 on_error=lambda stage, e: failed.append(stage), waiting_on_peers=lambda s: in_collective.get(s, False))
    t = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        p.run(sink)
    took = time.perf_counter() - t
    assert finished == [2]                          # the source was waited for
    assert took < 3 * INTERRUPT_GRACE_S + 1.0, took  # "b" was not
    release.set()
    time.sleep(0.2)
    assert failed == []


def test_switch_interval_is_set_for_the_block_and_restored():
    import sys

    from hps.pipeline import switch_interval

    before = sys.getswitchinterval()
    with switch_interval(2e-4):
        assert abs(sys.getswitchinterval() - 2e-4) < 1e-6
    assert sys.getswitchinterval() == before
    with switch_interval(None):
        assert sys.getswitchinterval() == before
    try:
        with switch_interval(3e-4):
            raise KeyError("inside")
    except KeyError:
        pass
    assert sys.getswitchinterval() == before
