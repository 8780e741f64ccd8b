"""Parallel readers: ``readers`` worker threads do a dataset's work units, the results come back in order.

Every dataset cuts a pass into *work units* (a chunk of text lines, a group of Parquet rows, a block
of synthetic examples) made one after the other by a cheap sequential producer, and a pure
``work(unit)`` that does the expensive part — parsing, hashing, generating — in nogil Numba kernels
or pyarrow (both release the GIL, so threads run in parallel). :func:`ordered_map` runs ``work`` on
``readers`` threads, at most ``readers * WINDOW_PER_READER`` units ahead of the consumer, and yields
the results **in the producer's order**; everything that depends on order (counting malformed lines,
the first reported ones, the checks that stop a pass, cutting batches) stays in the consumer. So a
dataset yields the same batches, counts and errors with any number of readers.

A unit whose ``work`` raised re-raises in the consumer when its turn comes (the units before it are
delivered first, as with one reader), and so does the producer's own failure (a file that cannot be
read further: the units it made before are delivered first); the units still in flight are cancelled
or waited for — each is one bounded call — so a failure never hangs and nothing runs on after the
iteration ends.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

from ..errors import InvalidInputError

#: Units in flight per reader: one being worked on, one waiting, so a reader never idles while the
#: consumer takes a result. Memory: ``readers * WINDOW_PER_READER`` units and their results.
WINDOW_PER_READER = 2


def check_readers(readers) -> int:
    """``readers`` as an int >= 1. Raises InvalidInputError."""
    if isinstance(readers, bool) or int(readers) != readers or readers < 1:
        raise InvalidInputError(f"readers must be a positive integer, got {readers!r}")
    return int(readers)


def ordered_map(work: Callable, units: Iterable, readers: int) -> Iterator:
    """``work(u)`` for every ``u`` of ``units``, in order, computed by ``readers`` threads (one reader:
    in the calling thread, nothing else started). ``units`` is iterated in the calling thread. Closing
    the generator (or an error) stops the producer and the workers before it returns."""
    if readers == 1:
        for u in units:
            yield work(u)
        return
    pool = ThreadPoolExecutor(readers, thread_name_prefix="hps-reader")
    pending: deque = deque()
    it = iter(units)
    failed = None  # the producer's error: raised after the units it made before failing, as with one reader
    try:
        more = True
        while True:
            while more and len(pending) < readers * WINDOW_PER_READER:
                try:
                    u = next(it, _END)
                except Exception as e:  # noqa: BLE001 - re-raised below, in its turn
                    failed, u = e, _END
                if u is _END:
                    more = False
                    break
                pending.append(pool.submit(work, u))
            if not pending:
                if failed is not None:
                    raise failed
                return
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True)  # the running units are single bounded calls
        close = getattr(it, "close", None)
        if close is not None:
            close()


_END = object()
