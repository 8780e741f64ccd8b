"""The CTR model and its optimizers.

- :class:`CTRModel` — field embeddings (weighted sum-pooled) ‖ dense features → MLP (ReLU) → sigmoid,
  mean binary cross-entropy; NumPy (Numba kernels) or CuPy, one code path. :class:`ModelConfig`
  describes it and its optimizers.
- Sparse row optimizers (:class:`SparseAdagrad` default, :class:`SparseSGD`) update rows laid out as
  ``[embedding | optimizer state]``; dense ones (:class:`DenseAdam` default, :class:`DenseSGD`) update
  the model's named tensors and checkpoint via ``state_dict()``.
- :func:`init_embeddings` — key-seeded initial embeddings (same on every rank and tier).
"""

from ._ctr import CTRModel, ModelConfig
from ._init import init_embeddings
from ._optim import (
    DenseAdam,
    DenseSGD,
    SparseAdagrad,
    SparseSGD,
    make_dense_optimizer,
    make_optimizers,
    make_sparse_optimizer,
)

__all__ = [
    "CTRModel",
    "ModelConfig",
    "init_embeddings",
    "SparseAdagrad",
    "SparseSGD",
    "DenseAdam",
    "DenseSGD",
    "make_sparse_optimizer",
    "make_dense_optimizer",
    "make_optimizers",
]
