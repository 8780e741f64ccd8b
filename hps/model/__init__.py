"""The models CTR practitioners train, and their optimizers.

- Models (``make_model(cfg)`` or the classes): :class:`CTRModel` (``ctr``: pooled field embeddings ‖
  dense features -> MLP), :class:`WideDeep` (``wdl``), :class:`DeepFM` (``deepfm``), :class:`DCN`
  (``dcn``, DCN-v2) and :class:`DLRM` (``dlrm``); each ends in a sigmoid and the mean binary
  cross-entropy, and runs on NumPy (Numba pooling kernels) or CuPy, one code path. They are
  compositions of the layers in ``_layers.py`` (linear/MLP, ReLU, cross, FM, dot interaction,
  pooling), each with an explicit forward and backward. :class:`ModelConfig` describes a model and its
  optimizers; ``MODELS`` maps ``--model`` names to classes.
- Row optimizers (:class:`SparseAdagrad` default, :class:`SparseRowwiseAdagrad`, :class:`SparseAdam`,
  :class:`SparseSGD`) update rows laid out as ``[parameters (row_params) | optimizer state]``; dense
  ones (:class:`DenseAdam` default, :class:`DenseAdagrad`, :class:`DenseSGD`) update the model's named
  tensors and checkpoint via ``state_dict()``.
- :func:`init_embeddings` — key-seeded initial embeddings (same on every rank and tier).
- :func:`flat_views`, :func:`flat_of` — dense tensors as views of one buffer (``_flat``): the models' dense
  parameters and gradients are, so the dense optimizer steps them in one pass.
"""

from ._base import FieldModel
from ._config import ModelConfig
from ._dense_optim import DenseAdagrad, DenseAdam, DenseSGD
from ._flat import flat_of, flat_views
from ._init import init_embeddings
from ._models import DCN, DLRM, MODELS, CTRModel, DeepFM, WideDeep, dense_shapes, make_model
from ._optim import make_dense_optimizer, make_optimizers, make_sparse_optimizer
from ._row_optim import SparseAdagrad, SparseAdam, SparseRowwiseAdagrad, SparseSGD

__all__ = [
    "FieldModel",
    "CTRModel",
    "WideDeep",
    "DeepFM",
    "DCN",
    "DLRM",
    "MODELS",
    "make_model",
    "dense_shapes",
    "ModelConfig",
    "init_embeddings",
    "flat_views",
    "flat_of",
    "SparseAdagrad",
    "SparseRowwiseAdagrad",
    "SparseAdam",
    "SparseSGD",
    "DenseAdam",
    "DenseAdagrad",
    "DenseSGD",
    "make_sparse_optimizer",
    "make_dense_optimizer",
    "make_optimizers",
]
