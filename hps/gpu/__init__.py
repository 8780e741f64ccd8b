"""GPU-resident training: the transfer ledger and the asynchronous operations over an HBM-PS table's
``device_view()`` (``_train_ops.py``, ``_row_ops.py``, ``_partition_ops.py``; kernels in
``_train_kernels.py``), which ``--device cuda`` training runs (``hps/train/_device_backend.py``).

The table itself (``hps.HashTable(device="cuda")``, its CUDA kernels and the partitioned table of
Algorithm 2) lives in ``hps.table``; ``PartitionedHashTable``, ``Placement`` and ``visible_gpus`` are
re-exported here, where the multi-GPU training code has always found them.
"""

from ..table import PartitionedHashTable, Placement, visible_gpus
from ._dedup import missing_keys, unique_inverse, unique_keys
from ._ledger import PURPOSES, TransferLedger
from ._partition_ops import part_of_async, partition_keys
from ._row_ops import (
    adagrad_update_async,
    adam_update_async,
    rowwise_adagrad_update_async,
    sgd_update_async,
    sparse_update_async,
)
from ._staging import PinnedStaging
from ._train_ops import (
    BackwardPlan,
    BatchScalars,
    backward_plan,
    bce_loss_grad_async,
    find_slots_async,
    gather_rows_async,
    pool_backward_async,
    pool_forward_async,
    pool_backward_sorted_async,
    pool_forward_rows_async,
)

__all__ = [
    "PartitionedHashTable",
    "Placement",
    "visible_gpus",
    "TransferLedger",
    "PURPOSES",
    "PinnedStaging",
    "BatchScalars",
    "BackwardPlan",
    "backward_plan",
    "pool_backward_sorted_async",
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
    "unique_inverse",
    "unique_keys",
    "missing_keys",
]
