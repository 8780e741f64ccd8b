"""``PlanStreams``: the streams and events that let a batch's upload and planning overlap the training of
the batches before it on the GPU.

The train stage issues its kernels (and the HBM-PS table its operations) on the legacy default stream.
The prepare and place stages issue theirs on two streams of their own (``upload``, ``place``), created
**non-blocking**: a non-blocking stream does not synchronise with the legacy default stream, so a
copy or kernel queued there runs beside the train stage's kernels instead of after them (CUDA
Runtime API, "Stream synchronization behavior"). The order each consumer needs is made explicit
with events, each recorded by the thread that issued the work and waited on by the thread that
consumes it (a wait enqueued before its event is recorded would not wait: the host hand-over through
the pipeline's queue orders the record first):

- prepare records ``uploaded`` on ``upload`` after a batch's raw arrays went up and its working set
  was computed, then waits for it on the host (:meth:`uploaded`, :meth:`host_wait`): the residency lookup that follows
  runs on the legacy stream, which the train thread shares; a device wait enqueued there would hold
  the train kernels issued after it behind this upload, a host wait holds only the prepare thread,
  and only for the upload stream's own work. (The lookup itself, the misses' insert and the
  evictions stay on the legacy stream, ordered after the train kernels issued before them: the table
  they change is the one those kernels read. So the upload and dedup overlap the training, the
  residency lookup does not; but the prepare thread waits for its misses with the table's lock
  released, so the train thread goes on launching meanwhile: ``LedgerTable.missing``.)
- place makes ``place`` wait for ``uploaded`` (:meth:`wait`, on the device) before reading the raw
  arrays, and records ``staged`` after the batch's mini-batch inputs are made;
- train makes its (the current) stream wait for ``staged`` (on the device, no host block) before the
  batch's first kernel.

``api``: the CUDA module of CuPy (``cupy.cuda``: ``Stream(non_blocking=...)``, ``Stream.record()``,
``Stream.wait_event()``, ``Event.synchronize()``, ``get_current_stream()``), or a stand-in of that
API (tests record its calls); None where arrays are NumPy (the CPU, Numba's CUDA simulator): then
there are no streams and every method does nothing. Thread safety: CUDA's (streams and events may be
used from any thread; each is used as described above).
"""

from __future__ import annotations

import contextlib

__all__ = ["PlanStreams", "stream_api"]


def stream_api(xp):
    """The stream API :class:`PlanStreams` takes for the array module ``xp``: ``cupy.cuda`` under CuPy,
    None for NumPy (no streams)."""
    return xp.cuda if getattr(xp, "__name__", "") == "cupy" else None


class PlanStreams:
    """See the module docstring."""

    def __init__(self, api=None):
        self.api = api
        self.upload = api.Stream(non_blocking=True) if api is not None else None
        self.place = api.Stream(non_blocking=True) if api is not None else None

    def on(self, stream):
        """Context making ``stream`` the current one (CuPy: its work and its pool's blocks); nothing
        without streams."""
        return stream if stream is not None else contextlib.nullcontext()

    @staticmethod
    def record(stream):
        """An event recorded on ``stream`` now (None without streams): complete once ``stream`` has run
        everything issued on it before."""
        return None if stream is None else stream.record()

    def wait(self, event, stream=None) -> None:
        """Make ``stream`` (default: the calling thread's current stream) wait on the device for
        ``event`` (None: nothing to wait for). Does not block the host."""
        if event is None:
            return
        (stream if stream is not None else self.api.get_current_stream()).wait_event(event)

    def uploaded(self, work):
        """The prepare stage's hand-over: ``work()`` run with ``upload`` current, then an event recorded
        on ``upload`` after it and waited for on the host (the residency lookup that follows runs on the
        legacy stream; see the module docstring) -> (what ``work`` returned, the event)."""
        with self.on(self.upload):
            out = work()
        event = self.record(self.upload)
        self.host_wait(event)
        return out, event

    @staticmethod
    def host_wait(event) -> None:
        """Block the calling thread until ``event`` (None: nothing) is complete."""
        if event is not None:
            event.synchronize()
