"""``ModelConfig``: the architecture, initialisation and optimizers of a model, once the data's field
counts are known. Validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import (DEFAULT_BOTTOM_HIDDEN, DEFAULT_CROSS_LAYERS, DENSE_OPTIMIZERS, SPARSE_OPTIMIZERS,
                      check_architecture)
from ..errors import InvalidInputError

__all__ = ["ModelConfig"]


@dataclass(frozen=True)
class ModelConfig:
    """Shape, initialisation and optimizers of a model (see ``hps.model.make_model``)."""

    n_fields: int                               #: number of categorical fields F (> 0)
    emb_dim: int = 16                           #: embedding width d (> 0)
    n_dense: int = 0                            #: dense (numerical) features per example (>= 0)
    hidden: tuple[int, ...] = (256, 128)        #: MLP hidden widths (dlrm: the top MLP), each > 0
    seed: int = 0                               #: seeds dense init and key-seeded embedding init
    model: str = "ctr"                          #: "ctr", "wdl", "deepfm", "dcn" or "dlrm"
    cross_layers: int = DEFAULT_CROSS_LAYERS    #: dcn: cross layers (>= 1)
    bottom_mlp: tuple[int, ...] | None = None   #: dlrm: bottom MLP widths ending at emb_dim; None = (64, d)
    emb_init_scale: float = 0.01                #: embeddings start U(-scale, scale), see ``init_embeddings``
    sparse_optimizer: str = "adagrad"           #: "adagrad", "rowwise-adagrad", "adam" or "sgd"
    sparse_lr: float = 0.05                     #: learning rate of the sparse (row) optimizer
    adagrad_initial_accumulator: float = 0.0    #: Adagrad accumulator of a new row / dense tensor (torch's)
    adagrad_eps: float = 1e-10                  #: Adagrad denominator epsilon (torch's default)
    emb_l2: float = 0.0                         #: L2 on the rows a mini-batch uses (grad += emb_l2 * row)
    dense_optimizer: str = "adam"               #: "adam", "adagrad" or "sgd"
    dense_lr: float = 1e-3                      #: learning rate of the dense optimizer
    adam_betas: tuple[float, float] = (0.9, 0.999)  #: Adam (beta1, beta2), rows and dense
    adam_eps: float = 1e-8                      #: Adam denominator epsilon, rows and dense
    dtype: str = "float32"                      #: parameter dtype, "float32" or "float64"

    def __post_init__(self):
        object.__setattr__(self, "hidden", tuple(int(h) for h in self.hidden))
        object.__setattr__(self, "adam_betas", tuple(float(b) for b in self.adam_betas))
        if self.bottom_mlp is not None:
            object.__setattr__(self, "bottom_mlp", tuple(int(h) for h in self.bottom_mlp))
        if self.n_fields <= 0 or self.emb_dim <= 0 or self.n_dense < 0:
            raise InvalidInputError(f"need n_fields > 0, emb_dim > 0, n_dense >= 0; got "
                                    f"{self.n_fields}, {self.emb_dim}, {self.n_dense}")
        check_architecture(self.model, self.emb_dim, self.hidden, self.cross_layers, self.bottom_mlp)
        if self.model == "dlrm" and self.n_fields + (self.n_dense > 0) < 2:
            raise InvalidInputError("dlrm needs two vectors to interact: two fields, or a field and dense "
                                    "features")
        if self.sparse_optimizer not in SPARSE_OPTIMIZERS:
            raise InvalidInputError(f"sparse_optimizer must be one of {', '.join(SPARSE_OPTIMIZERS)}, got "
                                    f"{self.sparse_optimizer!r}")
        if self.dense_optimizer not in DENSE_OPTIMIZERS:
            raise InvalidInputError(f"dense_optimizer must be one of {', '.join(DENSE_OPTIMIZERS)}, got "
                                    f"{self.dense_optimizer!r}")
        if not (self.sparse_lr > 0 and self.dense_lr > 0 and self.emb_init_scale >= 0):
            raise InvalidInputError("learning rates must be > 0 and emb_init_scale >= 0")
        if not (self.emb_l2 >= 0 and self.adagrad_initial_accumulator >= 0):
            raise InvalidInputError("emb_l2 and adagrad_initial_accumulator must be >= 0")
        if not all(0.0 <= b < 1.0 for b in self.adam_betas) or len(self.adam_betas) != 2:
            raise InvalidInputError(f"adam_betas must be two values in [0, 1), got {self.adam_betas}")
        if self.dtype not in ("float32", "float64"):
            raise InvalidInputError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")

    @property
    def bottom_widths(self) -> tuple[int, ...]:
        """dlrm: the bottom MLP widths in use (``bottom_mlp`` or ``(64, emb_dim)``)."""
        return self.bottom_mlp if self.bottom_mlp is not None else (DEFAULT_BOTTOM_HIDDEN, self.emb_dim)

    @classmethod
    def from_options(cls, opts, n_fields: int, n_dense: int, seed: int) -> "ModelConfig":
        """The architecture a training run builds from its :class:`hps.config.ModelOptions` flags and
        the data's field counts (dlrm's top MLP is ``top_mlp`` or ``hidden``)."""
        hidden = opts.top_mlp if opts.model == "dlrm" and opts.top_mlp is not None else opts.hidden
        return cls(n_fields=n_fields, emb_dim=opts.embedding_dim, n_dense=n_dense, hidden=hidden, seed=seed,
                   model=opts.model, cross_layers=opts.cross_layers or DEFAULT_CROSS_LAYERS,
                   bottom_mlp=opts.bottom_mlp, emb_init_scale=opts.init_scale,
                   sparse_optimizer=opts.sparse_optimizer, sparse_lr=opts.lr,
                   adagrad_initial_accumulator=opts.adagrad_init, emb_l2=opts.emb_l2,
                   dense_optimizer=opts.dense_optimizer, dense_lr=opts.dense_lr)
