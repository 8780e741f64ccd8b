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
completes within microseconds), then sleeps of 20 µs doubling to :data:`POLL_MAX_S` = 200 µs. The cap
matters more than it looks: MPICH advances a non-blocking collective only inside some call of each
rank (a message over 8 KB between two ranks of a node is a rendezvous: sender, receiver, sender), so
every stage of every collective waits out the sleep of whichever rank it needs next. With a 1 ms cap,
4 ranks on 2 cores spent ~37 ms of each mini-batch's ~4 collectives asleep with the cores idle
(docs/benchmarks.md, section "Scaling"); 200 µs keeps a sleeping rank's polls under ~1 % of a core.
"""

from __future__ import annotations

import os
import time

from ..errors import CommError, InvalidInputError
from ._mpi import MPI, node_cores

#: ``--mpi-wait`` values: ``auto`` picks ``yield`` when the ranks on a node outnumber its cores.
WAIT_MODES = ("auto", "spin", "yield")
#: Tests of a pending request with ``sched_yield`` in between before the first sleep.
POLL_YIELDS = 20
#: First and longest sleep between two tests of a pending request (seconds).
POLL_FIRST_S = 2e-5
POLL_MAX_S = 2e-4


def poll(request) -> None:
    """Wait for an mpi4py ``Request``: test it, giving the core away in between (``sched_yield``, then
    growing sleeps; module docstring). Never busy-waits longer than :data:`POLL_YIELDS` tests."""
    for _ in range(POLL_YIELDS):
        if request.Test():
            return
        os.sched_yield()
    delay = POLL_FIRST_S
    while not request.Test():
        time.sleep(delay)
        delay = min(2 * delay, POLL_MAX_S)


def node_share(comm) -> tuple[int, int]:
    """(ranks of ``comm`` on this node, cores they may run on: the fewest any of them sees).
    Collective over ``comm``; (1, ``node_cores()``) without one."""
    if comm is None:
        return 1, node_cores()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        return node.Get_size(), node.allreduce(node_cores(), op=MPI.MIN)
    finally:
        node.Free()


def resolve_wait_mode(comm, mode: str) -> str:
    """``"spin"`` or ``"yield"`` for ``mode`` (one of :data:`WAIT_MODES`); ``auto`` yields when the
    ranks of ``comm`` sharing this node outnumber its cores. Collective over ``comm`` (the answer is
    the same on every rank of a node)."""
    if mode not in WAIT_MODES:
        raise InvalidInputError(f"mpi-wait must be one of {', '.join(WAIT_MODES)}; got {mode!r}")
    local, cores = node_share(comm)
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
