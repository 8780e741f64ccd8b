"""Optimizer factories: by name, or as a :class:`~hps.model.ModelConfig` describes them.

Sparse (row) optimizers are in ``_row_optim.py``, dense ones in ``_dense_optim.py``.
"""

from __future__ import annotations

from ..errors import InvalidInputError
from ._dense_optim import DenseAdagrad, DenseAdam, DenseSGD
from ._row_optim import SparseAdagrad, SparseAdam, SparseRowwiseAdagrad, SparseSGD

__all__ = ["make_sparse_optimizer", "make_dense_optimizer", "make_optimizers"]

_SPARSE = {c.name: c for c in (SparseAdagrad, SparseRowwiseAdagrad, SparseAdam, SparseSGD)}
_DENSE = {c.name: c for c in (DenseAdam, DenseAdagrad, DenseSGD)}


def make_sparse_optimizer(name: str, lr: float, **kwargs):
    """Row optimizer by name: ``"adagrad"`` (:class:`SparseAdagrad`), ``"rowwise-adagrad"``
    (:class:`SparseRowwiseAdagrad`), ``"adam"`` (:class:`SparseAdam`) or ``"sgd"`` (:class:`SparseSGD`);
    ``kwargs`` go to its constructor."""
    if name not in _SPARSE:
        raise InvalidInputError(f"unknown sparse optimizer {name!r}; choose from {sorted(_SPARSE)}")
    return _SPARSE[name](lr, **kwargs)


def make_dense_optimizer(name: str, lr: float, **kwargs):
    """Dense optimizer by name: ``"adam"`` (:class:`DenseAdam`), ``"adagrad"`` (:class:`DenseAdagrad`)
    or ``"sgd"`` (:class:`DenseSGD`); ``kwargs`` go to its constructor."""
    if name not in _DENSE:
        raise InvalidInputError(f"unknown dense optimizer {name!r}; choose from {sorted(_DENSE)}")
    return _DENSE[name](lr, **kwargs)


def make_optimizers(cfg):
    """(sparse, dense) optimizers described by a :class:`~hps.model.ModelConfig`."""
    adagrad = {"initial_accumulator": cfg.adagrad_initial_accumulator, "eps": cfg.adagrad_eps}
    adam = {"betas": cfg.adam_betas, "eps": cfg.adam_eps}
    sparse_kw = {"adagrad": adagrad, "rowwise-adagrad": adagrad, "adam": adam}.get(cfg.sparse_optimizer, {})
    dense_kw = {"adagrad": adagrad, "adam": adam}.get(cfg.dense_optimizer, {})
    sparse = make_sparse_optimizer(cfg.sparse_optimizer, cfg.sparse_lr, l2=cfg.emb_l2, **sparse_kw)
    dense = make_dense_optimizer(cfg.dense_optimizer, cfg.dense_lr, **dense_kw)
    return sparse, dense
