"""How a rank waits inside MPI: spin (MPI's blocking calls) or yield the core (poll a non-blocking
call, sleeping between polls), and the thread level several communicating threads need.

MPICH and Open MPI busy-poll inside a blocking call: a rank blocked 3 s in a collective burns 3 s
of a core. That costs nothing while every rank has a core of its own, and everything when ranks
(and their pipeline threads) outnumber the cores: the spinning rank takes the core from the rank it
is waiting for. In ``"yield"`` mode a call is started non-blocking and its request is tested with
the core given away in between, so a waiting rank leaves it to the ranks it waits for; each test
also drives MPI's progress engine, which is all a non-blocking collective needs to advance.

The schedule between two tests: first ``sched_yield`` (:data:`POLL_YIELDS` times: the core goes at once
to a runnable rank, and comes straight back when none is, so a collective whose peers are all in it
completes within microseconds), then sleeps of 20 µs doubling to :data:`POLL_MAX_S` = 200 µs, and once
the wait has lasted longer, sleeps of a quarter of the time waited so far (:data:`POLL_WAITED_FRACTION`)
up to :data:`POLL_LONG_MAX_S` = 2 ms (:func:`next_sleep`).

The 200 µs cap matters more than it looks: MPICH advances a non-blocking collective only inside some
call of each rank (a message over MPICH's single-copy threshold between two ranks of a node is a
rendezvous: sender, receiver, sender), so every stage of every collective waits out the sleep of
whichever rank it needs next. With a 1 ms cap, 4 ranks on 2 cores spent ~37 ms of each mini-batch's
~4 collectives asleep with the cores idle (docs/benchmarks.md, section "Scaling"). But a rank that has
waited long is waiting for a slow peer to arrive, and each wake-up costs it ~10-25 µs of CPU (the
timer, the switch, a test driving MPICH's progress engine): on the issue's 4-rank job (2 cores, shared)
a wait lasted ~10 ms (median), ~50 wake-ups at 200 µs. Sleeping a quarter of the time waited sees the
completion at most ~25 % late, in 18 wake-ups for 10 ms (53 before) and one per 2 ms beyond. That
holds the peers up little when what they send this rank goes eagerly (no step of theirs waits for the
sleeper's next call): the MPICH cells a job asks for when ranks outnumber cores make a mini-batch's
messages go so (``_mpi.MPICH_SETTINGS``). Sleeps of half the time waited up to 5 ms saved no more CPU and kept the
train thread 1.3x as long in MPI (1.8x without the cells; docs/benchmarks.md, "Scaling").

:class:`Waiter` is the one place that chooses between the two for a call: the hand-written schedules
(``_schedule`` through the codecs of ``_sparse`` and ``_dense``), the owner exchange (``_exchange``) and
the trainer's channels (``hps.train._collectives``) make every MPI call through one.
"""

from __future__ import annotations

import os
import pickle
import time

import numpy as np

from ..errors import CommError, InvalidInputError
from ._mpi import MPI, cpu_set, node_cores

#: ``--mpi-wait`` values: ``auto`` picks ``yield`` when the ranks on a node outnumber its cores (the
#: others are what it resolves to: a :class:`Waiter`'s modes).
WAIT_MODES = ("auto", "spin", "yield")
#: The wait mode of a job and of a :class:`~hps.comm.Topology` when none is named.
DEFAULT_WAIT = "auto"
#: Tests of a pending request with ``sched_yield`` in between before the first sleep.
POLL_YIELDS = 20
#: First sleep between two tests of a pending request, and the cap of its doubling (seconds).
POLL_FIRST_S = 2e-5
POLL_MAX_S = 2e-4
#: Past the doubling, a sleep may be this fraction of the time waited so far ...
POLL_WAITED_FRACTION = 0.25
#: ... up to this long (seconds).
POLL_LONG_MAX_S = 2e-3


def next_sleep(delay: float, waited: float) -> float:
    """The sleep after one of ``delay`` seconds, ``waited`` seconds into the wait: double
    up to :data:`POLL_MAX_S`, or :data:`POLL_WAITED_FRACTION` of ``waited`` when that is longer, never
    over :data:`POLL_LONG_MAX_S` (module docstring)."""
    return min(max(min(2 * delay, POLL_MAX_S), waited * POLL_WAITED_FRACTION), POLL_LONG_MAX_S)


def wait_until(test) -> None:
    """Call ``test()`` until it is true, giving the core away in between (``sched_yield``, then growing
    sleeps; module docstring). Never busy-waits longer than :data:`POLL_YIELDS` tests."""
    t0 = time.perf_counter()
    for _ in range(POLL_YIELDS):
        if test():
            return
        os.sched_yield()
    delay = POLL_FIRST_S
    while not test():
        time.sleep(delay)
        delay = next_sleep(delay, time.perf_counter() - t0)


def poll(request) -> None:
    """Wait for an mpi4py ``Request``: test it, giving the core away in between (:func:`wait_until`)."""
    wait_until(request.Test)


def node_share(comm) -> tuple[int, int]:
    """(ranks of ``comm`` on this node, cores they may run on together: the union of their CPU sets, so
    8 ranks each pinned to 2 cores of their own count 16, and 4 unpinned ranks on 2 cores count 2).
    Collective over ``comm``; (1, ``node_cores()``) without one."""
    if comm is None:
        return 1, node_cores()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.Get_size(), len(frozenset().union(*node.allgather(cpu_set())))
    finally:
        node.Free()


def resolve_wait_mode(comm, mode: str, share: tuple[int, int] | None = None) -> str:
    """``"spin"`` or ``"yield"`` for ``mode`` (one of :data:`WAIT_MODES`); ``auto`` yields when the
    ranks of ``comm`` sharing this node outnumber its cores. Collective over ``comm`` (the answer is
    the same on every rank of a node), unless the caller passes the :func:`node_share` it already has."""
    if mode not in WAIT_MODES:
        raise InvalidInputError(f"mpi-wait must be one of {', '.join(WAIT_MODES)}; got {mode!r}")
    local, cores = node_share(comm) if share is None else share
    if mode != "auto":
        return mode
    return "yield" if local > cores else "spin"


def require_thread_multiple() -> None:
    """Raise CommError unless MPI was initialised with ``MPI_THREAD_MULTIPLE`` (hps's pipeline threads
    issue collectives concurrently, each on its own communicator)."""
    level = MPI.Query_thread()
    if level < MPI.THREAD_MULTIPLE:
        names = {MPI.THREAD_SINGLE: "MPI_THREAD_SINGLE", MPI.THREAD_FUNNELED: "MPI_THREAD_FUNNELED",
                 MPI.THREAD_SERIALIZED: "MPI_THREAD_SERIALIZED"}
        raise CommError(f"MPI provides {names.get(level, level)}, but hps's pipeline threads call MPI "
                        "concurrently and need MPI_THREAD_MULTIPLE: use an MPI built with thread support "
                        "(MPICH, Open MPI) and leave mpi4py.rc.thread_level at 'multiple'")


class Waiter:
    """How a rank waits inside MPI: the one place that picks MPI's blocking call (``"spin"``) or its
    non-blocking twin with the request polled (``"yield"``, :func:`poll`) for every call of hps's
    schedules (``_schedule``, ``_sparse``, ``_dense``, ``_exchange``) and of the trainer's channels.

    Every method is a call of ``comm`` with MPI's meaning and blocks until the call has completed
    (the buffers are free again or filled): :meth:`run` any call given in both forms, and the
    point-to-point calls of the hand-written schedules. In yield mode nothing waits inside MPI: a
    probe is an ``Iprobe`` loop, a send or receive an ``Isend``/``Irecv`` tested until done. Stateless
    beyond its mode: one Waiter may serve any number of threads and communicators."""

    __slots__ = ("mode", "spin")

    def __init__(self, mode: str = "spin"):
        if mode not in WAIT_MODES[1:]:
            raise InvalidInputError(f"a Waiter spins or yields (resolve 'auto' with resolve_wait_mode); got {mode!r}")
        self.mode = mode
        self.spin = mode == "spin"

    @classmethod
    def resolve(cls, comm, mode: str) -> "Waiter":
        """The Waiter of ``mode`` (one of :data:`WAIT_MODES`) over ``comm`` (:func:`resolve_wait_mode`;
        collective over ``comm``; ``None``: spin)."""
        return cls(resolve_wait_mode(comm, mode)) if comm is not None else cls("spin")

    def run(self, blocking, nonblocking=None):
        """One MPI call: ``blocking()`` when spinning (or when the call has no non-blocking form) -> what
        it returned; else ``nonblocking()`` -> a Request, polled to completion -> None."""
        if self.spin or nonblocking is None:
            return blocking()
        poll(nonblocking())
        return None

    def wait_all(self, requests) -> None:
        """Complete every request of ``requests`` (a list of mpi4py Requests)."""
        if self.spin:
            MPI.Request.Waitall(requests)
            return
        for r in requests:
            poll(r)

    def send(self, comm, buf, dest: int, tag: int) -> None:
        self.run(lambda: comm.Send(buf, dest, tag), lambda: comm.Isend(buf, dest, tag))

    def recv(self, comm, buf, src: int, tag: int) -> None:
        self.run(lambda: comm.Recv(buf, src, tag), lambda: comm.Irecv(buf, src, tag))

    def sendrecv(self, comm, sendbuf, recvbuf, partner: int, tag: int) -> None:
        """Send ``sendbuf`` to ``partner`` and receive its message of ``tag`` into ``recvbuf``."""
        if self.spin:
            comm.Sendrecv(sendbuf, partner, tag, recvbuf, partner, tag)
            return
        self.wait_all([comm.Irecv(recvbuf, partner, tag), comm.Isend(sendbuf, partner, tag)])

    def probe(self, comm, src: int, tag: int, status) -> None:
        """Wait until a message of ``tag`` from ``src`` can be received; its envelope goes to ``status``
        (an ``MPI.Status``). REQUIRES one thread at a time receiving on ``comm`` with ``tag``."""
        if self.spin:
            comm.Probe(src, tag, status)
            return
        wait_until(lambda: comm.Iprobe(src, tag, status))

    def bcast(self, comm, buf, root: int = 0) -> None:
        self.run(lambda: comm.Bcast(buf, root=root), lambda: comm.Ibcast(buf, root=root))

    def allgather_obj(self, comm, obj) -> list:
        """Every rank's small picklable ``obj``, in rank order (``comm.allgather``; yielding: the pickles'
        sizes and bytes through ``Iallgather``/``Iallgatherv``)."""
        if self.spin:
            return comm.allgather(obj)
        mine = np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)
        sizes = np.empty(comm.Get_size(), np.int64)
        n = np.array([mine.shape[0]], np.int64)
        self.run(None, lambda: comm.Iallgather(n, sizes))
        every = np.empty(int(sizes.sum()), np.uint8)
        self.run(None, lambda: comm.Iallgatherv(mine, [every, (sizes, None)]))
        ends = np.cumsum(sizes)
        return [pickle.loads(every[e - k:e].tobytes()) for k, e in zip(sizes.tolist(), ends.tolist())]


#: The waiter of MPI's own blocking calls (the library's default for a bare communicator).
SPIN = Waiter("spin")
