"""Node grouping of a communicator: which ranks share a node, and who their counterparts are."""

from __future__ import annotations

import numbers

from ..errors import InvalidInputError, InvalidTypeError
from ._mpi import MPI
from ._wait import DEFAULT_WAIT, WAIT_MODES, Waiter


class Topology:
    """Ranks of ``comm`` grouped into nodes, with the communicators the hierarchical collectives use.

    Collective over ``comm`` (construction and :meth:`free`). Not thread-safe: one thread at a time
    may run collectives on one Topology (MPI communicators are not shared between concurrent calls).

    Grouping, in order of precedence:

    * ``node_ids`` (sequence of ``comm.size`` ints, the same on every rank): rank ``r`` is on node
      ``node_ids[r]``; nodes may be uneven. For tests of uneven and non-power-of-two layouts.
    * ``ranks_per_node`` (int, same on every rank, must divide ``comm.size``): consecutive ranks form a
      node, so 4 ranks on one machine can act as 2 nodes x 2 GPUs.
    * default: ``comm.Split_type(MPI.COMM_TYPE_SHARED)`` (ranks sharing memory = one node).

    Nodes are numbered in the order of their lowest rank; inside a node, local ranks follow ``comm``
    rank order, so local rank 0 (the *node leader*) is the node's lowest rank.

    Attributes: ``comm`` (a private dup of the input: library traffic never mixes with the caller's),
    ``rank``, ``size``, ``node_comm`` (ranks on my node), ``local_rank``, ``local_size``,
    ``cross_comm`` (ranks with my local rank on every node that has one; its rank = my node id among
    them), ``leader_comm`` (``cross_comm`` of the node leaders; ``None`` on non-leaders), ``node_id``,
    ``n_nodes``, ``node_sizes`` (tuple, ranks per node), ``uniform`` (all nodes the same size),
    ``cuda_aware`` (every rank's MPI takes device buffers; see :func:`hps.comm.cuda_aware`), ``waiter``
    (how the collectives on this Topology wait in MPI, a ``_wait.Waiter``: ``wait`` is one of
    ``WAIT_MODES``, ``auto`` yields when the ranks on a node outnumber its cores; the same on every rank).

    The all-reduce schedule (node reduce -> leaders' recursive doubling -> node broadcast) works for
    uneven nodes too; the paper's variant (every local index exchanges across nodes in parallel, then
    an intra-node all-reduce) needs even nodes and is what ``cross_comm`` is for.
    """

    def __init__(self, comm, ranks_per_node: int | None = None, node_ids=None, wait: str = DEFAULT_WAIT):
        if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
            raise InvalidInputError(f"comm must be an mpi4py communicator, got {comm!r}")
        if comm.Is_inter():
            raise InvalidInputError("comm must be an intra-communicator")
        size = comm.Get_size()
        rank = comm.Get_rank()
        # Every rank checks every rank's arguments after one allgather (nothing before it can raise), so
        # a bad argument raises on every rank, before any other collective: nothing hangs.
        args = comm.allgather((ranks_per_node, _node_ids_or_error(node_ids), wait))
        bad = [(r, a[1][1]) for r, a in enumerate(args) if isinstance(a[1], tuple) and a[1][:1] == ("error",)]
        if bad:
            raise InvalidTypeError(f"node_ids must be a sequence of comm.size ints, the same on every rank "
                                   f"(rank r's node, e.g. [0, 0, 1, 1]): rank {bad[0][0]} passed {bad[0][1]}")
        if any(a != args[0] for a in args):
            raise InvalidInputError(f"Topology arguments differ between ranks: {args}")
        if wait not in WAIT_MODES:
            raise InvalidInputError(f"wait must be one of {', '.join(WAIT_MODES)}; got {wait!r}")
        if node_ids is not None:
            node_ids = args[0][1]
            if len(node_ids) != size:
                raise InvalidInputError(f"node_ids must have one entry per rank ({size}), got {len(node_ids)}")
            out = [(r, c) for r, c in enumerate(node_ids) if not 0 <= c < _MAX_COLOR]
            if out:
                raise InvalidInputError(f"node_ids must lie in [0, 2**31) (MPI colors), got {str(out[0][1])[:40]} "
                                        f"for rank {out[0][0]}; pass e.g. the node index 0, 1, ... of each rank")
            color = node_ids[rank]
        elif ranks_per_node is not None:
            rpn = ranks_per_node
            if isinstance(rpn, bool) or not isinstance(rpn, int) or rpn < 1:
                raise InvalidInputError(f"ranks_per_node must be a positive int, got {rpn!r}")
            if size % rpn:
                raise InvalidInputError(
                    f"ranks_per_node={rpn} does not divide the number of ranks ({size}); "
                    "use node_ids for uneven nodes"
                )
            color = rank // rpn
        else:
            color = None

        self.comm = comm.Dup()
        self.rank = rank
        self.size = size
        if color is None:
            self.node_comm = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        else:
            self.node_comm = self.comm.Split(color, key=rank)
        self.local_rank = self.node_comm.Get_rank()
        self.local_size = self.node_comm.Get_size()
        leader = self.node_comm.bcast(rank, root=0)
        per_rank = self.comm.allgather((leader, self.local_size))
        leaders = sorted({lead for lead, _ in per_rank})
        self.node_id = leaders.index(leader)
        self.n_nodes = len(leaders)
        sizes = dict(per_rank)
        self.node_sizes = tuple(sizes[lead] for lead in leaders)
        self.uniform = len(set(self.node_sizes)) == 1
        self.cross_comm = self.comm.Split(self.local_rank, key=self.node_id)
        self.leader_comm = self.cross_comm if self.local_rank == 0 else None
        from ._cuda import cuda_aware

        self.cuda_aware = cuda_aware(self.comm)  # collective: decided here, once, the same on every rank
        self.waiter = Waiter.resolve(self.comm, wait)  # collective too

    @property
    def is_leader(self) -> bool:
        return self.local_rank == 0

    def free(self) -> None:
        """Free the communicators this Topology created. Collective; the object is unusable after."""
        for name in ("cross_comm", "node_comm", "comm"):
            c = getattr(self, name, None)
            if c is not None and c != MPI.COMM_NULL:
                c.Free()
            setattr(self, name, None)
        self.leader_comm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def __repr__(self) -> str:
        return (
            f"Topology(rank={self.rank}/{self.size}, node={self.node_id}/{self.n_nodes}, "
            f"local={self.local_rank}/{self.local_size}, node_sizes={self.node_sizes})"
        )


_MAX_COLOR = 2**31  # MPI_Comm_split takes a C int color


def _node_ids_or_error(node_ids):
    """``node_ids`` as a tuple of Python ints, ``None`` as is, or ``("error", what)`` saying what is wrong
    with it. Never raises: its result goes to the allgather every rank checks."""
    if node_ids is None:
        return None
    if isinstance(node_ids, (str, bytes)):
        return ("error", f"a {type(node_ids).__name__}, not a sequence of ints")
    try:
        items = tuple(node_ids)
    except Exception:  # not iterable, or an iterator that raised
        return ("error", f"an object of type {type(node_ids).__name__}, not a sequence")
    ids = []
    for x in items:
        try:
            if isinstance(x, bool) or not isinstance(x, numbers.Real):
                ok = False
            else:
                ok = isinstance(x, numbers.Integral) or float(x).is_integer()  # 2.0 is node 2, 0.5 no node
            if ok:
                ids.append(int(x))
                continue
        except Exception:  # e.g. a float() that overflows: reported below like any bad entry
            pass
        return ("error", f"the entry {x!r:.40} of type {type(x).__name__}, not an integer")
    return tuple(ids)
