"""GPU-resident training: the transfer ledger and the asynchronous operations over an HBM-PS table's
``device_view()`` (``_train_ops.py``, ``_row_ops.py``, ``_partition_ops.py``; kernels in
``_train_kernels.py``), which ``--device cuda`` training runs (``hps/train/_device_backend.py``).

The table itself (``hps.HashTable(device="cuda")``, its CUDA kernels and the partitioned table of
Algorithm 2) lives in ``hps.table``; ``PartitionedHashTable``, ``Placement`` and ``visible_gpus`` are
re-exported here, where the multi-GPU training code has always found them.
"""

from __future__ import annotations

import importlib

#: Where each name lives; imported on first use (PEP 562), so a CPU job that names ``Placement`` or
#: ``TransferLedger`` does not import numba-cuda with the kernels (~0.25 s of every process's start).
_WHERE = {
    "..table": ("PartitionedHashTable", "Placement", "visible_gpus"),
    "._batch_plans": ("minibatch_plans",),
    "._dedup": ("lookup_slots", "missing_keys", "unique_inverse", "unique_keys"),
    "._ledger": ("PURPOSES", "TransferLedger", "transfer_metrics"),
    "._partition_ops": ("part_of_async", "partition_keys"),
    "._staging": ("PinnedStaging", "index_dtype"),
    "._streams": ("PlanStreams", "stream_api"),
    "._row_ops": ("adagrad_update_async", "adam_update_async", "init_rows_async", "rowwise_adagrad_update_async",
                  "sgd_update_async", "sparse_update_async"),
    "._train_ops": ("BackwardPlan", "BatchScalars", "backward_plan", "bce_loss_grad_async", "find_slots_async",
                    "gather_rows_async", "pool_backward_async", "pool_forward_async", "pool_backward_sorted_async",
                    "pool_forward_rows_async"),
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}
__all__ = list(_MODULE_OF)  # the public names: those of _WHERE


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

