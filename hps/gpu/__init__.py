"""HBM-PS: the GPU hash table kernels and the multi-device partitioned table (Algorithm 2)."""
