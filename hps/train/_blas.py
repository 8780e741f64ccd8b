"""How many threads the dense model's host pass uses while training, sized between batches to the
cores the other pipeline stages leave idle.

The dense model's forward and backward run in chunks of examples on ``threads`` threads
(``hps.model._chunks``: the train stage's own thread plus helpers that sleep between mini-batches),
while the read, prepare and place stages (and the SSD-PS I/O threads they wait on) run on the same
cores. OpenBLAS's own pool is kept at one thread: its workers spin for up to ~0.1 s after every
product and took a core from those stages (on the 2-core VM the larger-than-DRAM job,
``python -m bench.bench_train scale``, trained 35 % faster with one BLAS thread than with two, and the
in-memory out-of-core baseline ~1.4x; docs/training.md, "--blas-threads").

:class:`DenseThreads` decides from measurements, not a fixed share: after every trained batch it
reads the pipeline's stage timings (``hps.pipeline.StageTimes``, cumulative busy seconds per stage),
and over the last ``WINDOW_BATCHES`` batches computes how many cores the other stages kept busy::

    others = sum of the read, prepare and place stages' busy seconds / wall seconds
    spare  = cores - 1 - others            (cores beside the train thread that nobody used)

Helper ``k`` (k = 1, 2, ...) is added when ``spare >= k - 1 + GROW_SHARE`` (its core would be at least
half idle) and dropped when ``spare < k - 1 + KEEP_SHARE``; the gap between the two keeps the count
from flapping. The count starts at ``cores``: the first decision needs a window of two trained batches,
and a job whose train stage is the bottleneck (the usual case) would otherwise train its first batches
on one thread (2 of the 13 batches of the 200k-line Criteo-format DCN job, ``bench.peer_torch``); a
wrong start costs no spinning (helpers sleep) and at most those batches' time-slicing with the other
stages. A stage's busy time counts the time it waits on I/O inside its work, so an I/O-bound
prepare (the larger-than-DRAM job: read + prepare + place busy 1.08 cores over its run) keeps the
count at one, as does the in-memory job whose stages are busy ~1 core; a 2-core Criteo-format job
whose other stages are busy ~0.25 cores gets a helper. ``--blas-threads N`` fixes the count at N.
Results do not depend on the count (``_chunks``), so adapting changes speed, never what is trained.

The helpers' CPU seconds belong to the train stage: :meth:`DenseThreads.after_batch` puts those spent
since :meth:`DenseThreads.bound` into the stage's ``StageTimes.helper_cpu``, so the stage's CPU figure
(``_job_metrics``) is the whole dense pass's on any thread count, not the train thread's share of it
(a 1-rank job on 2 threads otherwise reported ~0.65 of its train stage's CPU).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque

from ..errors import InvalidInputError

__all__ = ["DenseThreads", "limit_blas", "GROW_SHARE", "KEEP_SHARE", "WINDOW_BATCHES", "TRAIN_STAGE"]

#: A helper is added when the core it would take is at least this idle...
GROW_SHARE = 0.5
#: ...and kept while that core stays at least this idle.
KEEP_SHARE = 0.3
#: Batches the busy fractions are measured over (the pipeline's stages run a batch apart).
WINDOW_BATCHES = 3
#: The stage the dense model runs in; every other stage of the timings counts as "others".
TRAIN_STAGE = "train"


class DenseThreads:
    """The dense model's host thread count: ``fixed`` (``--blas-threads``) or adapted between batches
    within ``[1, cores]`` (``cores``: this rank's share of the node's cores).

    ``threads`` is the current count; :meth:`decide` is the pure rule (tests feed it synthetic
    timings); :meth:`after_batch` measures and applies it to the bound model (:meth:`bound`). Not
    thread-safe: the train stage's thread calls it.
    """

    def __init__(self, fixed: int | None, cores: int, window: int = WINDOW_BATCHES):
        if fixed is not None and (int(fixed) != fixed or fixed < 1):
            raise InvalidInputError(f"--blas-threads must be a positive integer, got {fixed!r}")
        self.fixed = None if fixed is None else int(fixed)
        self.cores = max(1, int(cores))
        self.threads = self.fixed if self.fixed is not None else self.cores  # every core until measured
        self._marks: deque = deque(maxlen=max(1, int(window)) + 1)  # (wall, others' busy seconds)
        self._model = None
        self._helper_cpu0 = 0.0  # the bound model's helpers' CPU seconds when it was bound
        self.batches_at: dict[int, int] = {}  # thread count -> batches trained with it

    @property
    def label(self):
        """The fixed count, or ``"auto (1-C)"``."""
        return self.fixed if self.fixed is not None else f"auto (1-{self.cores})"

    def decide(self, others_busy: float, wall: float) -> int:
        """The thread count after a window in which the other stages were busy ``others_busy``
        seconds in total over ``wall`` seconds (sets and returns :attr:`threads`)."""
        if self.fixed is not None or wall <= 0:
            return self.threads
        spare = self.cores - 1 - others_busy / wall
        t = self.threads
        while t < self.cores and spare >= t - 1 + GROW_SHARE:
            t += 1
        while t > 1 and spare < t - 2 + KEEP_SHARE:
            t -= 1
        self.threads = t
        return t

    def after_batch(self, stage_times: dict, now: float | None = None) -> int:
        """Record a trained batch, re-decide from the last window's timings (``stage_times``: name ->
        object with a cumulative ``busy`` in seconds) and apply the count to the bound model. The bound
        model's helpers' CPU seconds so far go to the train stage's ``helper_cpu`` (module docstring)."""
        self.batches_at[self.threads] = self.batches_at.get(self.threads, 0) + 1
        if self._model is not None and TRAIN_STAGE in stage_times:
            stage_times[TRAIN_STAGE].helper_cpu = self._model.helper_cpu_seconds - self._helper_cpu0
        now = time.perf_counter() if now is None else now
        self._marks.append((now, sum(t.busy for name, t in stage_times.items() if name != TRAIN_STAGE)))
        if len(self._marks) > 1:
            (w0, b0), (w1, b1) = self._marks[0], self._marks[-1]
            self.decide(b1 - b0, w1 - w0)
        if self._model is not None and self._model.threads != self.threads:
            self._model.set_threads(self.threads)
        return self.threads

    @contextlib.contextmanager
    def bound(self, model):
        """``with``: ``model`` runs on :attr:`threads` threads (re-decided by :meth:`after_batch`),
        OpenBLAS on one (the model's threads are the parallelism); on exit the model's helpers stop."""
        self._model = model
        self._helper_cpu0 = model.helper_cpu_seconds
        self._marks.clear()
        model.set_threads(self.threads)
        try:
            with limit_blas(1):
                yield self
        finally:
            self._model = None
            model.set_threads(1)

    def metrics(self) -> dict:
        """``{"dense_threads": fixed count or "auto (1-C)", "dense_threads_batches": {count: batches}}``."""
        return {"dense_threads": self.label, "dense_threads_batches": dict(sorted(self.batches_at.items()))}


def limit_blas(n: int):
    """Context manager: the BLAS libraries NumPy loaded use at most ``n`` threads in the block."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an install without it: BLAS keeps its own default
        return contextlib.nullcontext()
    return threadpool_limits(limits=int(n), user_api="blas")
