"""A pipeline of stages in their own threads, joined by bounded queues (Appendix B of ``seeds/004``).

Each stage takes an item from its input queue, works on it, and puts the result on the next queue;
it blocks when that queue is full (the next stage already has ``depth`` unprocessed items), so with
the trainer's four stages (read, prepare, place, train) batch *i* trains while *i+1* is placed,
*i+2* prepared and *i+3* read.

Every stage records its busy time (inside its function), the CPU time its thread used meanwhile
(``time.thread_time``) and its waiting time (blocked on the input queue or on a full output queue);
:meth:`Pipeline.report` names the bottleneck stage (most busy).

Failure: the first exception in any stage stops the whole pipeline (other stages are woken and exit)
and is re-raised from :meth:`Pipeline.run` as :class:`hps.errors.PipelineError` naming the stage, with
the original exception (and its traceback) as ``__cause__``. ``on_error(stage, exc)``, if given, is
called first, in the failing thread (e.g. to abort an MPI job at once: a peer may be waiting in a
collective this process will never join).

Interrupt: a ``KeyboardInterrupt`` (or subclass) raised in the caller's thread while it drives the
pipeline — Ctrl-C, or any signal handler that raises one — stops every stage the same way and is
re-raised unchanged, not wrapped: it is the user's decision, not a stage's failure.

Stopping never waits longer than ``stop_timeout_s`` in all for the stage threads to finish the item
each is working on; a thread still busy after that (e.g. blocked in a collective whose peers have
stopped) is a daemon thread left behind, and :meth:`Pipeline.run` returns or raises anyway. After an
interrupt, a thread that ``waiting_on_peers(stage name)`` says is waiting in a collective is left
behind after ``INTERRUPT_GRACE_S``: its peers, stopped by the same signal a collective earlier, may
never join it (every rank of an MPI job is interrupted, and each exits without it). What such a
thread raises later is not reported: the interrupt already stopped the pipeline.

Thread safety: a Pipeline is driven by one caller thread; stage functions run in their own threads
and must be thread-safe with respect to each other.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from .errors import PipelineError

_DONE = object()  # end-of-stream marker, passed down the queues
_POLL_S = 0.05
#: Default of ``Pipeline(stop_timeout_s=...)``: how long stopping waits for busy stage threads.
STOP_TIMEOUT_S = 60.0
#: After an interrupt, how long stopping waits for a stage thread that is waiting on its peers.
INTERRUPT_GRACE_S = 0.5


@dataclass
class StageTimes:
    """Seconds of one stage: ``busy`` (wall, in its work), ``cpu`` (its thread's CPU in its work),
    ``helper_cpu`` (CPU of other threads working for it, e.g. a model's chunk helpers; set by whoever
    owns them), ``wait_in`` / ``wait_out`` (on its queues); ``items`` processed."""

    busy: float = 0.0
    cpu: float = 0.0
    helper_cpu: float = 0.0
    wait_in: float = 0.0
    wait_out: float = 0.0
    items: int = 0


@dataclass
class Stage:
    """``fn(item) -> item`` run in its own thread; ``name`` appears in reports and errors.

    ``gate(item)``, if given, runs first and its time counts as waiting, not busy (e.g. waiting for a
    later stage to release a resource); it must return when the pipeline stops, and then ``fn`` is
    not called on the item."""

    name: str
    fn: Callable
    gate: Callable | None = None
    times: StageTimes = field(default_factory=StageTimes)


class Pipeline:
    """``Pipeline(source_name, source_iterable, [Stage, ...], depth=1, stop_timeout_s=60,
    on_error=None, waiting_on_peers=None)``; ``run(sink)`` drives it. ``waiting_on_peers(name)``: whether
    the thread of stage ``name`` is now inside a collective (called from the caller's thread)."""

    def __init__(self, source_name: str, source: Iterable, stages: list[Stage], depth: int = 1,
                 stop_timeout_s: float = STOP_TIMEOUT_S, on_error: Callable | None = None,
                 waiting_on_peers: Callable[[str], bool] | None = None):
        self.on_error = on_error
        self.waiting_on_peers = waiting_on_peers
        self._interrupted = False
        self.source = Stage(source_name, lambda x: x)
        self._source_iter = source
        self.stages = stages
        self.depth = max(1, int(depth))
        self.stop_timeout_s = float(stop_timeout_s)
        self._stop = threading.Event()
        self._error: tuple[str, BaseException] | None = None
        self._lock = threading.Lock()

    @property
    def stop_event(self) -> threading.Event:
        """Set once the pipeline stops (end of a failure); long waits inside stages should watch it."""
        return self._stop

    # -- queue helpers that give up when the pipeline stops ------------------------------------------------
    def _put(self, q: queue.Queue, item, times: StageTimes) -> bool:
        t = time.perf_counter()
        while not self._stop.is_set():
            try:
                q.put(item, timeout=_POLL_S)
                times.wait_out += time.perf_counter() - t
                return True
            except queue.Full:
                continue
        return False

    def _get(self, q: queue.Queue, times: StageTimes):
        t = time.perf_counter()
        while not self._stop.is_set():
            try:
                item = q.get(timeout=_POLL_S)
                times.wait_in += time.perf_counter() - t
                return item
            except queue.Empty:
                continue
        return _DONE

    def _fail(self, stage: str, exc: BaseException) -> None:
        if self._interrupted:  # a thread left behind by an interrupt, failing as the job winds down
            return
        if self.on_error is not None:
            self.on_error(stage, exc)
        with self._lock:
            if self._error is None:
                self._error = (stage, exc)
        self._stop.set()

    # -- threads -----------------------------------------------------------------------------------------
    def _run_source(self, out: queue.Queue) -> None:
        times = self.source.times
        try:
            it = iter(self._source_iter)
            while not self._stop.is_set():
                t, c = time.perf_counter(), time.thread_time()
                try:
                    item = next(it)
                except StopIteration:
                    break
                times.busy += time.perf_counter() - t
                times.cpu += time.thread_time() - c
                times.items += 1
                if not self._put(out, item, times):
                    return
            self._put(out, _DONE, times)
        except BaseException as e:  # noqa: BLE001 - reported to the caller, never swallowed
            self._fail(self.source.name, e)

    def _run_stage(self, stage: Stage, inq: queue.Queue, out: queue.Queue) -> None:
        times = stage.times
        try:
            while True:
                item = self._get(inq, times)
                if item is _DONE:
                    self._put(out, _DONE, times)
                    return
                if stage.gate is not None:
                    t = time.perf_counter()
                    stage.gate(item)
                    times.wait_in += time.perf_counter() - t
                    if self._stop.is_set():  # a gate returns early when the pipeline stops: the
                        return               # resource it waited for may still be in use
                t, c = time.perf_counter(), time.thread_time()
                result = stage.fn(item)
                times.busy += time.perf_counter() - t
                times.cpu += time.thread_time() - c
                times.items += 1
                if not self._put(out, result, times):
                    return
        except BaseException as e:  # noqa: BLE001
            self._fail(stage.name, e)

    def run(self, sink: Callable | None = None) -> None:
        """Run to the end of the source; ``sink(item)`` (in the caller's thread) takes the last
        stage's results. Raises PipelineError if any stage (or the sink) failed, and re-raises a
        KeyboardInterrupt of the caller's thread after stopping every stage."""
        queues = [queue.Queue(maxsize=self.depth) for _ in range(len(self.stages) + 1)]
        threads = [threading.Thread(target=self._run_source, args=(queues[0],), name=self.source.name,
                                    daemon=True)]
        for i, st in enumerate(self.stages):
            threads.append(threading.Thread(target=self._run_stage, args=(st, queues[i], queues[i + 1]),
                                            name=st.name, daemon=True))
        for th in threads:
            th.start()
        sink_times = StageTimes()
        interrupt = None
        try:
            while True:
                item = self._get(queues[-1], sink_times)
                if item is _DONE:
                    break
                if sink is not None:
                    sink(item)
        except KeyboardInterrupt as e:  # the caller was interrupted: stop, then let it through
            interrupt = e
            self._interrupted = True
            self._stop.set()
        except BaseException as e:  # noqa: BLE001
            self._fail("sink", e)
        finally:
            if self._error is not None:
                self._stop.set()
            self._join(threads)
        if interrupt is not None:
            raise interrupt
        if self._error is not None:
            stage, exc = self._error
            raise PipelineError(stage, f"{type(exc).__name__}: {exc}") from exc

    def _join(self, threads: list[threading.Thread]) -> None:
        """Wait for the stopped stage threads: ``stop_timeout_s`` in all; after an interrupt, no longer
        than ``INTERRUPT_GRACE_S`` for one waiting on its peers (module docstring)."""
        now = time.monotonic()
        deadline, grace = now + self.stop_timeout_s, now + INTERRUPT_GRACE_S
        peers = self.waiting_on_peers if self._interrupted else None
        for th in threads:
            while th.is_alive() and time.monotonic() < deadline:
                if peers is not None and time.monotonic() >= grace and peers(th.name):
                    break  # left behind: see the module docstring
                th.join(timeout=min(_POLL_S, max(0.0, deadline - time.monotonic())))

    # -- reporting -----------------------------------------------------------------------------------------
    def stage_times(self) -> dict[str, StageTimes]:
        return {s.name: s.times for s in [self.source, *self.stages]}

    def bottleneck(self) -> str:
        """The stage with the most busy time."""
        return max(self.stage_times().items(), key=lambda kv: kv[1].busy)[0]

    def report(self) -> str:
        lines = [f"{'stage':<10} {'busy s':>9} {'wait-in s':>10} {'wait-out s':>11} {'items':>6}"]
        for name, t in self.stage_times().items():
            lines.append(f"{name:<10} {t.busy:9.2f} {t.wait_in:10.2f} {t.wait_out:11.2f} {t.items:6d}")
        lines.append(f"bottleneck: {self.bottleneck()}")
        return "\n".join(lines)


@contextlib.contextmanager
def switch_interval(seconds: float | None):
    """``with``: the interpreter's thread switch interval (``sys.setswitchinterval``) set to ``seconds``
    (None: left as it is), restored after. Process-wide. A stage that makes many short calls which
    release the GIL (a GPU launch, a BLAS call) must take the GIL back each time, and waits up to the
    interval while another stage runs Python."""
    if seconds is None:
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(float(seconds))
    try:
        yield
    finally:
        sys.setswitchinterval(before)
