"""The models' host pass split into fixed chunks of examples, and the threads that run the chunks.

On the host (NumPy) a mini-batch's network forward and backward run chunk by chunk, ``CHUNK_ROWS``
examples at a time: a chunk's activations fit in a core's L2 cache (a 1,024-example pass of the
default MLP streams ~2 MB per elementwise step through L3; 256 examples ~0.4 MB), and the examples of
a mini-batch are independent until their dense gradients are summed, so chunks can run on several
threads. :class:`ChunkThreads` runs them on the caller plus ``threads - 1`` helper threads.

Chunk boundaries depend only on the number of examples, never on the thread count, and the per-chunk
dense gradients are summed in chunk order: a mini-batch's results are bit-identical on 1 or N
threads, so the thread count may change between batches without changing what is trained.

Helpers sleep on a condition variable between calls. Unlike a BLAS pool's workers (OpenBLAS spins
for up to ~0.1 s after every product) they take no core from the other pipeline stages while the
model is not computing; the caller takes chunks too, so a helper that is slow to wake delays
nothing but the chunk it took.
"""

from __future__ import annotations

import threading
import time

from ..errors import InvalidInputError

__all__ = ["CHUNK_ROWS", "chunk_bounds", "ChunkThreads"]

#: Examples per chunk of a host pass. Fixed (not derived from the thread count) so that results do
#: not depend on how many threads ran them; 256 keeps the default models' per-chunk activations in L2.
CHUNK_ROWS = 256


def chunk_bounds(n: int, rows: int | None) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` covering ``range(n)`` in chunks of ``rows`` examples (the last one may
    be shorter); ``rows=None``: one chunk. ``n == 0``: one empty chunk (a pass still runs once)."""
    if rows is None or n <= rows:
        return [(0, n)]
    return [(s, min(s + rows, n)) for s in range(0, n, rows)]


class _Job:
    """One :meth:`ChunkThreads.run` call: chunk ``i`` is ``fn(i)``, taken in index order."""

    __slots__ = ("fn", "k", "next", "left", "results", "error", "lock", "done")

    def __init__(self, fn, k: int):
        self.fn, self.k, self.next, self.left = fn, k, 0, k
        self.results: list = [None] * k
        self.error = None  # (index, exception) of the lowest failed chunk
        self.lock = threading.Lock()
        self.done = threading.Event()

    def work(self) -> None:
        """Take chunks until none is left (called by the caller and by every awake helper)."""
        while True:
            with self.lock:
                i = self.next
                if i >= self.k:
                    return
                self.next = i + 1
            try:
                r, err = self.fn(i), None
            except BaseException as e:  # handed to the caller, raised there
                r, err = None, e
            with self.lock:
                self.results[i] = r
                if err is not None and (self.error is None or i < self.error[0]):
                    self.error = (i, err)
                self.left -= 1
                if self.left == 0:
                    self.done.set()


class ChunkThreads:
    """Runs ``fn(0), ..., fn(k - 1)`` on ``threads`` threads: the caller and ``threads - 1`` helpers.

    ``run`` returns the results in index order, or raises the exception of the lowest failing chunk
    after every chunk has finished. Chunks must be independent (write disjoint outputs). Helpers are
    daemon threads, started when first needed and stopped by ``resize(1)``; they wait on a condition
    variable between calls. Thread-safe: concurrent ``run`` calls are serialised.

    ``helper_cpu_seconds``: CPU seconds the helpers spent running chunks (their thread time), so the
    caller can count the whole pass's CPU, not only its own thread's.
    """

    def __init__(self, threads: int = 1):
        self._cv = threading.Condition()
        self._run_lock = threading.Lock()
        self._job: _Job | None = None
        self._gen = 0
        self._helpers: list[threading.Thread] = []
        self._keep = 0  # helpers with an index below this keep running
        self._cpu_lock = threading.Lock()
        self.helper_cpu_seconds = 0.0
        self.threads = 1
        self.resize(threads)

    def resize(self, threads: int) -> None:
        """Run later calls on ``threads`` threads (>= 1). Helpers start at the first call with more
        than one chunk; fewer threads stop the extra helpers at once (blocks until they have exited; a
        helper inside a chunk finishes it first)."""
        if int(threads) != threads or threads < 1:
            raise InvalidInputError(f"threads must be a positive integer, got {threads!r}")
        want = int(threads) - 1
        with self._run_lock:
            with self._cv:
                self._keep = want
                self._cv.notify_all()
            for t in self._helpers[want:]:
                t.join()
            del self._helpers[want:]
            self.threads = want + 1

    def run(self, fn, k: int) -> list:
        """``[fn(0), ..., fn(k - 1)]``, the chunks spread over the threads. Blocking."""
        if self.threads == 1 or k <= 1:
            return [fn(i) for i in range(k)]
        with self._run_lock:
            for i in range(len(self._helpers), self.threads - 1):
                t = threading.Thread(target=self._helper, args=(i,), name=f"hps-chunk-{i + 1}", daemon=True)
                t.start()
                self._helpers.append(t)
            job = _Job(fn, k)
            with self._cv:
                self._job = job
                self._gen += 1
                self._cv.notify_all()
            job.work()
            job.done.wait()
            self._job = None
        if job.error is not None:
            raise job.error[1]
        return job.results

    def _helper(self, index: int) -> None:
        seen = 0
        while True:
            with self._cv:
                while self._gen == seen and index < self._keep:
                    self._cv.wait()
                if index >= self._keep:
                    return
                seen, job = self._gen, self._job
            if job is not None:
                c = time.thread_time()
                job.work()
                c = time.thread_time() - c
                with self._cpu_lock:
                    self.helper_cpu_seconds += c
