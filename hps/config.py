"""Configuration: one dataclass per subsystem, composed into :class:`Config`; validated on construction.

Only ``hps.train``'s CLI parses arguments; everything else takes these objects. Sizes are global
(``batch_size``/``minibatch_size`` describe the whole job; under ``mpirun -np N`` each rank reads its
own shards of the data and contributes 1/N of every mini-batch).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields

from .errors import InvalidInputError

FORMATS = ("synthetic", "criteo", "libsvm", "csv")
SPARSE_OPTIMIZERS = ("adagrad", "sgd")
DENSE_OPTIMIZERS = ("adam", "sgd")
DEVICES = ("cpu", "cuda")
SPARSE_SYNCS = ("owner", "allreduce")
MPI_WAITS = ("auto", "spin", "yield")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "G": 1 << 30, "GB": 1 << 30, "T": 1 << 40, "TB": 1 << 40}


def parse_bytes(text) -> int:
    """``"512MB"`` -> 536870912; plain integers are bytes. Raises InvalidInputError."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?B?)\s*", str(text).upper())
    if not m:
        raise InvalidInputError(f"cannot read {text!r} as a size; use e.g. 512MB, 2GB or a byte count")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _positive(obj, *names):
    for n in names:
        v = getattr(obj, n)
        if v is not None and v <= 0:
            raise InvalidInputError(f"{n.replace('_', '-')} must be positive, got {v}")


def _one_of(name, value, allowed):
    if value not in allowed:
        raise InvalidInputError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


@dataclass
class DataConfig:
    format: str = "synthetic"           # synthetic | criteo | libsvm | csv
    data: str | None = None             # training file (not used by synthetic)
    eval_data: str | None = None        # evaluation file; synthetic has its own eval split
    rows: int = 200_000                 # synthetic: training examples
    fields: int = 8                     # synthetic: categorical fields
    vocab_per_field: int = 20_000       # synthetic: distinct values per field
    zipf: float = 1.1                   # synthetic: Zipf exponent of value popularity
    n_dense: int = 4                    # synthetic: dense features
    label_column: str = "click"         # csv: the label column
    libsvm_fields: int | None = None    # libsvm: positional fields (default: features on line 1)
    strict: bool = False                # first malformed line is an error instead of skipped
    data_shards: int | None = None      # shards the data is cut into (None = one per rank)

    def __post_init__(self):
        _one_of("format", self.format, FORMATS)
        _positive(self, "rows", "fields", "vocab_per_field", "zipf", "libsvm_fields", "data_shards")
        if self.format != "synthetic" and not self.data:
            raise InvalidInputError(f"--format {self.format} needs --data FILE")


@dataclass
class ModelOptions:
    """The model flags of a training run (``hps.model.ModelConfig`` is the architecture the trainer
    builds from them once the data's field counts are known)."""

    embedding_dim: int = 16                     # per-field embedding width
    hidden: tuple[int, ...] = (128, 64)         # MLP hidden layers (ReLU)
    sparse_optimizer: str = "adagrad"           # adagrad | sgd, applied to embedding rows
    dense_optimizer: str = "adam"               # adam | sgd, applied to the MLP
    lr: float = 0.2                             # sparse (embedding) learning rate
    dense_lr: float = 1e-3                      # dense (MLP) learning rate
    init_scale: float = 0.01                    # embeddings start uniform in [-s, s), from the key
    adagrad_init: float = 0.001                 # Adagrad accumulator of a new row; > 0 keeps the first
                                                # step smooth in the gradient, so runs that sum a
                                                # gradient in another order (N ranks) stay within 1e-5

    def __post_init__(self):
        self.hidden = tuple(int(h) for h in self.hidden)
        _one_of("sparse optimizer", self.sparse_optimizer, SPARSE_OPTIMIZERS)
        _one_of("dense optimizer", self.dense_optimizer, DENSE_OPTIMIZERS)
        _positive(self, "embedding_dim", "lr", "dense_lr", "init_scale")
        if self.adagrad_init < 0:
            raise InvalidInputError(f"adagrad-init must be >= 0, got {self.adagrad_init}")
        if any(h <= 0 for h in self.hidden):
            raise InvalidInputError(f"hidden layer sizes must be positive, got {self.hidden}")


@dataclass
class TierConfig:
    device: str = "cpu"                 # where HBM-PS and the model live: cpu | cuda
    mem_budget: int | None = None       # MEM-PS DRAM budget in bytes; None = 256 MiB
    ssd_path: str | None = None         # SSD-PS directory; None = a temporary directory
    rows_per_file: int = 16_384         # SSD-PS rows per parameter file (the I/O unit)
    hbm_capacity: int | None = None     # HBM-PS keys; None = sized from the first batch
    n_parts: int = 1                    # HBM-PS parts (GPUs) per process

    def __post_init__(self):
        _one_of("device", self.device, DEVICES)
        if self.mem_budget is not None:
            self.mem_budget = parse_bytes(self.mem_budget)
        _positive(self, "mem_budget", "rows_per_file", "hbm_capacity", "n_parts")


@dataclass
class TrainConfig:
    batch_size: int = 16_384            # examples per batch (the pipeline's unit), whole job
    minibatch_size: int = 1_024         # examples per synchronous update, whole job
    epochs: int = 1
    seed: int = 0
    queue_depth: int = 1                # items waiting between two pipeline stages
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0           # batches between checkpoints; 0 = end of every epoch only
    resume: bool = False                # continue from checkpoint_dir
    export: str | None = None           # directory for the HDF5 export of the trained model
    metrics_out: str | None = None      # JSON metrics file
    plots: str | None = None            # directory for PNG figures (needs matplotlib)
    ranks_per_node: int | None = None   # MPI: override node grouping (tests: 4 ranks = 2 x 2)
    sparse_sync: str = "owner"          # MPI: owner (rows live at their owner) | allreduce (App. C.3)
    mpi_wait: str = "auto"              # MPI: spin | yield (poll with sleeps) | auto (yield if oversubscribed)
    progress: bool = True               # tqdm progress bar

    def __post_init__(self):
        _positive(self, "batch_size", "minibatch_size", "epochs", "queue_depth", "ranks_per_node")
        _one_of("sparse-sync", self.sparse_sync, SPARSE_SYNCS)
        _one_of("mpi-wait", self.mpi_wait, MPI_WAITS)
        if self.checkpoint_every < 0:
            raise InvalidInputError("checkpoint-every must be >= 0")
        if self.minibatch_size > self.batch_size:
            raise InvalidInputError(f"minibatch-size ({self.minibatch_size}) must not exceed batch-size "
                                    f"({self.batch_size})")
        if self.resume and not self.checkpoint_dir:
            raise InvalidInputError("--resume needs --checkpoint-dir")


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelOptions = field(default_factory=ModelOptions)
    tiers: TierConfig = field(default_factory=TierConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @staticmethod
    def from_flat(values: dict) -> "Config":
        """Build from a flat ``{option: value}`` dict (CLI flags / TOML keys, dashes or underscores)."""
        values = {k.replace("-", "_"): v for k, v in values.items()}
        parts = {}
        for name, cls in (("data", DataConfig), ("model", ModelOptions), ("tiers", TierConfig),
                          ("train", TrainConfig)):
            own = {f.name for f in fields(cls)}
            parts[name] = cls(**{k: values.pop(k) for k in list(values) if k in own})
        if values:
            raise InvalidInputError(f"unknown option(s): {', '.join(sorted(values))}")
        return Config(**parts)
