"""The HBM-PS building block: a batch key -> row hash table on the CPU (Numba) or a GPU (Numba CUDA),
and the table split over several parts (Algorithm 2 of ``shared/seeds/004``, Section 4.1).

Layout (one package for the table, its backends and its partitioning; nothing here imports ``hps.gpu``,
whose training operations work on a table's :class:`TableView`):

- ``_hashtable``  :class:`HashTable`, the public front (validation, capacity, growth, locking);
- ``_cpu`` / ``_cpu_kernels``    the CPU backend and its ``@njit`` kernels;
- ``_cuda`` / ``_cuda_kernels``  the CUDA backend (host object owning device memory) and its kernels;
- ``_partitioned`` :class:`PartitionedHashTable`; ``_placement`` :class:`Placement` (part -> GPU).
- ``_cache`` / ``_cache_kernels_cpu`` / ``_cache_kernels_cuda``: the table as the HBM-PS cache across
  batches (a score per slot, victims chosen on the device), :meth:`HashTable.lookup` / ``evict``.

CUDA launches go through the one launch helper, ``hps._launch``.
"""

from ._cache import BATCH_LIMIT
from ._hashtable import DEFAULT_MAX_LOAD_FACTOR, SLOT_OVERHEAD_BYTES, HashTable, TableView, slots_for
from ._partitioned import PartitionedHashTable
from ._placement import Placement, visible_gpus

__all__ = ["HashTable", "TableView", "PartitionedHashTable", "Placement", "visible_gpus", "slots_for",
           "DEFAULT_MAX_LOAD_FACTOR", "SLOT_OVERHEAD_BYTES", "BATCH_LIMIT"]
