"""HBM-PS: the GPU hash table (Numba CUDA kernels behind ``hps.HashTable(device="cuda")``), the
multi-device partitioned table of Algorithm 2, and the pieces of GPU-resident training: the
transfer ledger and the asynchronous training operations over a table's ``device_view()``
(``hps/gpu/_train_ops.py``, ``_row_ops.py``), which ``--device cuda`` training runs
(``hps/train/_device_backend.py``)."""

from ._ledger import PURPOSES, TransferLedger
from ._partition_ops import part_of_async, partition_keys
from ._placement import Placement, visible_gpus
from ._row_ops import (
    adagrad_update_async,
    adam_update_async,
    rowwise_adagrad_update_async,
    sgd_update_async,
    sparse_update_async,
)
from ._train_ops import (
    BatchScalars,
    bce_loss_grad_async,
    find_slots_async,
    gather_rows_async,
    pool_backward_async,
    pool_forward_async,
    pool_forward_rows_async,
)
from .partitioned import PartitionedHashTable

__all__ = [
    "PartitionedHashTable",
    "Placement",
    "visible_gpus",
    "TransferLedger",
    "PURPOSES",
    "BatchScalars",
    "find_slots_async",
    "pool_forward_async",
    "pool_forward_rows_async",
    "pool_backward_async",
    "gather_rows_async",
    "sgd_update_async",
    "adagrad_update_async",
    "rowwise_adagrad_update_async",
    "adam_update_async",
    "sparse_update_async",
    "bce_loss_grad_async",
    "part_of_async",
    "partition_keys",
]
