"""HBM-PS: the GPU hash table (Numba CUDA kernels behind ``hps.HashTable(device="cuda")``) and the
multi-device partitioned table of Algorithm 2."""

from .partitioned import PartitionedHashTable

__all__ = ["PartitionedHashTable"]
