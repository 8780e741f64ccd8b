"""Byte and time counters of the communication layer."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import InvalidInputError

#: Kinds of traffic, as named in ``--metrics-out`` (``bytes_sent`` is split by these).
SPARSE_PULL = "sparse_pull"              # rows fetched from their owners (pull_remote, residency fetch)
SPARSE_ALLREDUCE = "sparse_allreduce"    # gradient rows of the hierarchical sparse all-reduce
DENSE_ALLREDUCE = "dense_allreduce"      # dense gradients
OWNER_WRITEBACK = "owner_writeback"      # rows pushed to their owners (push_to_owners)
SPARSE_KEYS = "sparse_keys"              # keys (and their counts) sent to owners / gathered
SPARSE_ROWS = "sparse_rows"              # embedding rows an owner serves for a mini-batch
SPARSE_GRADS = "sparse_grads"            # per-key gradient sums sent to their owners
# --consistency het (hps/train/_het_sync.py)
HET_CLOCKS = "het_clocks"                # global clocks an owner sends for the keys asked of it
HET_CONTROL = "het_control"              # fetch flags, one bit per asked key (packed per rank)
HET_PUSH = "het_push"                    # pushed gradients with their keys and clocks
DENSE_EASGD = "dense_easgd"              # EASGD rounds between groups and the centre copy (--dense-sync easgd)
KINDS = (SPARSE_PULL, SPARSE_ALLREDUCE, DENSE_ALLREDUCE, OWNER_WRITEBACK, SPARSE_KEYS, SPARSE_ROWS,
         SPARSE_GRADS, HET_CLOCKS, HET_CONTROL, HET_PUSH, DENSE_EASGD)


@dataclass
class CommStats:
    """Bytes this rank handed to MPI as a sender, and seconds spent, per kind of traffic.

    Bytes count payload sent to *other* ranks (self-sends are free); a broadcast root counts its
    payload once per receiver. Thread-safe: a lock guards every update.
    """

    bytes_sent: dict = field(default_factory=lambda: {k: 0 for k in KINDS})
    seconds: dict = field(default_factory=lambda: {k: 0.0 for k in KINDS})
    calls: dict = field(default_factory=lambda: {k: 0 for k in KINDS})

    def __post_init__(self):
        self._lock = threading.Lock()

    def add(self, kind: str, nbytes: int, seconds: float = 0.0, calls: int = 0) -> None:
        """Add ``nbytes`` and ``seconds`` to ``kind`` (one of :data:`KINDS`)."""
        if kind not in KINDS:
            raise InvalidInputError(f"unknown traffic kind {kind!r}; expected one of {KINDS}")
        with self._lock:
            self.bytes_sent[kind] += int(nbytes)
            self.seconds[kind] += float(seconds)
            self.calls[kind] += int(calls)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sent.values())

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def as_dict(self) -> dict:
        """Plain-dict snapshot: ``{"bytes_sent": {...}, "seconds": {...}, "calls": {...}}``."""
        with self._lock:
            return {"bytes_sent": dict(self.bytes_sent), "seconds": dict(self.seconds), "calls": dict(self.calls)}

    def reset(self) -> None:
        with self._lock:
            for k in KINDS:
                self.bytes_sent[k] = 0
                self.seconds[k] = 0.0
                self.calls[k] = 0


class _Meter:
    """Accumulates one call's bytes; committed to a CommStats (if any) with the elapsed time."""

    __slots__ = ("nbytes",)

    def __init__(self):
        self.nbytes = 0

    def sent(self, nbytes: int) -> None:
        self.nbytes += int(nbytes)


@contextmanager
def metered(stats, kind: str):
    """``with metered(stats, KIND) as m: ... m.sent(n)``; adds bytes, seconds and one call to stats."""
    meter = _Meter()
    t0 = time.perf_counter()
    try:
        yield meter
    finally:
        if stats is not None:
            stats.add(kind, meter.nbytes, time.perf_counter() - t0, calls=1)
