"""hps.comm — the communication layer: key-owner exchange, hierarchical all-reduce, GPU staging.

Every function takes its communicator (an mpi4py ``Comm``) or a :class:`Topology` built from one;
nothing reaches for ``MPI.COMM_WORLD``. All collectives are blocking and must be called by every rank
of the communicator in the same order; how a rank waits in them (MPI's spinning calls, or polled
non-blocking ones that leave the core to the other ranks) is a :class:`Waiter`'s choice: the
Topology's (``wait=``), or the ``waiter=`` of the functions on a bare communicator (default: spin). Run the rank's work under :func:`run_guarded` (or
:func:`abort_on_error`) so a failure anywhere ends the whole job quickly.

    topo = Topology(comm, ranks_per_node=2)           # 4 ranks -> 2 "nodes" x 2 "GPUs"; wait="auto"|"spin"|"yield"
    keys, sums = sparse_allreduce(topo, keys, grads)  # union of keys, summed rows, same bits everywhere
    dense = dense_allreduce(topo, dense_grads)
    ordered_allreduce(comm, vec)                      # in place, every element summed in rank order
    keys, sums = ordered_sparse_allreduce(comm, keys, grads)  # the same, for rows of keys
    rows = pull_remote(comm, keys, owner, serve_fn)   # rows of keys from their owner ranks
"""

from ._cuda import ENV_FORCE, cuda_aware, is_device_array, local_cuda_support, to_device_like, to_host
from ._dense import dense_allreduce
from ._exchange import exchange, pull_remote, push_to_owners
from ._ordered import (PendingReduceScatter, allgather_chunks, fold, ordered_allreduce, ordered_reduce_scatter,
                       ordered_sparse_allreduce, start_reduce_scatter)
from ._failure import abort_job, abort_on_error, failure_message, install_excepthook, run_guarded
from ._sparse import compile_kernels, sparse_allreduce, sparse_allreduce_allgather
from ._compress import COMPRESS_MODES, Compression
from ._stats import (DENSE_ALLREDUCE, DENSE_EASGD, KINDS, OWNER_WRITEBACK, SPARSE_ALLREDUCE, SPARSE_GRADS, SPARSE_KEYS,
                     SPARSE_PULL, SPARSE_ROWS, CommStats)
from ._stats import HET_CLOCKS, HET_CONTROL, HET_PUSH
from ._topology import Topology
from ._wait import DEFAULT_WAIT, WAIT_MODES, Waiter, node_cores, node_share, poll, require_thread_multiple, resolve_wait_mode

__all__ = [
    "Topology",
    "sparse_allreduce",
    "sparse_allreduce_allgather",
    "compile_kernels",
    "dense_allreduce",
    "ordered_allreduce",
    "ordered_sparse_allreduce",
    "ordered_reduce_scatter",
    "start_reduce_scatter",
    "PendingReduceScatter",
    "allgather_chunks",
    "fold",
    "exchange",
    "pull_remote",
    "push_to_owners",
    "CommStats",
    "KINDS",
    "SPARSE_PULL",
    "SPARSE_ALLREDUCE",
    "DENSE_ALLREDUCE",
    "DENSE_EASGD",
    "Compression",
    "COMPRESS_MODES",
    "OWNER_WRITEBACK",
    "SPARSE_KEYS",
    "SPARSE_ROWS",
    "SPARSE_GRADS",
    "HET_CLOCKS",
    "HET_CONTROL",
    "HET_PUSH",
    "WAIT_MODES",
    "DEFAULT_WAIT",
    "Waiter",
    "poll",
    "resolve_wait_mode",
    "node_share",
    "node_cores",
    "require_thread_multiple",
    "cuda_aware",
    "local_cuda_support",
    "ENV_FORCE",
    "is_device_array",
    "to_host",
    "to_device_like",
    "run_guarded",
    "abort_on_error",
    "abort_job",
    "install_excepthook",
    "failure_message",
]
