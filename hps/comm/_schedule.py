"""Communication schedules shared by the dense and sparse hierarchical all-reduce.

A schedule moves opaque *payloads* through a ``codec`` object with methods ``send(comm, dest, p, meter)``,
``recv(comm, src, meter) -> p``, ``sendrecv(comm, partner, p, meter) -> p``, ``combine(low, high) -> p``
(the payload of the lower rank first) and ``bcast(comm, p, meter) -> p`` (root 0). Every combine has a
fixed place in the schedule, independent of which rank computes it, so all ranks end with the same bits.
"""

from __future__ import annotations


def tree_reduce(comm, payload, codec, meter):
    """Binomial-tree reduce to rank 0 of ``comm``. Returns the total on rank 0, ``None`` elsewhere.

    Rank r combines (own, from r + 2^k) for k = 0, 1, ... until bit k of r is set, then sends to r - 2^k.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    mask = 1
    while mask < size:
        if rank & mask:
            codec.send(comm, rank - mask, payload, meter)
            return None
        src = rank + mask
        if src < size:
            payload = codec.combine(payload, codec.recv(comm, src, meter))
        mask <<= 1
    return payload


def recursive_doubling(comm, payload, codec, meter):
    """All-reduce over ``comm`` in log2(size) pairwise exchange steps (Appendix C.3, Figure 9).

    Non-power-of-two sizes: the ``size - p2`` ranks above the largest power of two ``p2`` first fold
    their payload into rank ``r - p2``, sit out the exchange, and get the result back at the end.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return payload
    p2 = 1 << (size.bit_length() - 1)
    if rank >= p2:
        codec.send(comm, rank - p2, payload, meter)
        return codec.recv(comm, rank - p2, meter)
    extra = rank + p2
    if extra < size:
        payload = codec.combine(payload, codec.recv(comm, extra, meter))
    mask = 1
    while mask < p2:
        partner = rank ^ mask
        other = codec.sendrecv(comm, partner, payload, meter)
        payload = codec.combine(payload, other) if rank < partner else codec.combine(other, payload)
        mask <<= 1
    if extra < size:
        codec.send(comm, extra, payload, meter)
    return payload


def hierarchical_allreduce(topo, payload, codec, meter):
    """Node reduce to the leader -> leaders' recursive doubling across nodes -> broadcast in the node."""
    if topo.size == 1:
        return payload
    node_total = tree_reduce(topo.node_comm, payload, codec, meter)
    if topo.is_leader:
        node_total = recursive_doubling(topo.leader_comm, node_total, codec, meter)
    return codec.bcast(topo.node_comm, node_total, meter)
