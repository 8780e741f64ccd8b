"""HBM-PS: the GPU hash table (Numba CUDA kernels behind ``hps.HashTable(device="cuda")``), the
multi-device partitioned table of Algorithm 2, and the pieces of GPU-resident training: the
transfer ledger and the asynchronous training operations over a table's ``device_view()``
(``hps/gpu/_train_ops.py``; trainer integration pending)."""

from ._ledger import PURPOSES, TransferLedger
from ._train_ops import (
    BatchScalars,
    adagrad_update_async,
    bce_loss_grad_async,
    find_slots_async,
    pool_backward_async,
    pool_forward_async,
    sgd_update_async,
    sparse_update_async,
)
from .partitioned import PartitionedHashTable

__all__ = [
    "PartitionedHashTable",
    "TransferLedger",
    "PURPOSES",
    "BatchScalars",
    "find_slots_async",
    "pool_forward_async",
    "pool_backward_async",
    "sgd_update_async",
    "adagrad_update_async",
    "sparse_update_async",
    "bce_loss_grad_async",
]
