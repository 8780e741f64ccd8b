"""Configuration of a training job: one dataclass per part of the job (data, model options, tiers,
training), composed into :class:`Config`; each validated on construction.

These are the job's flags, not the libraries' own settings: the trainer builds the model and its
optimizers (through ``hps.model.ModelConfig.from_options``, once the data's field counts are known),
``hps.mem.MemPS`` and ``hps.ssd.SSDStore`` from these values (``hps.mem.MemConfig`` serves callers of
that library, not the job).

Only ``hps.train``'s CLI parses arguments; everything else takes these objects. Sizes are global
(``batch_size``/``minibatch_size`` describe the whole job; under ``mpirun -np N`` each rank reads its
own shards of the data and contributes 1/N of every mini-batch).

Every field's value is checked against its annotation on construction (an integer, a number, true or
false, a string; ``| None`` = may be unset), so a TOML value of the wrong type is one clear
``InvalidTypeError`` naming the option.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass, field, fields

from .data import DEFAULT_MAX_MALFORMED
from .data._batch import check_n_fields
from ._xp import DEVICES
from .errors import InvalidInputError, InvalidTypeError

FORMATS = ("synthetic", "criteo", "libsvm", "csv")
MODELS = ("ctr", "wdl", "deepfm", "dcn", "dlrm")
SPARSE_OPTIMIZERS = ("adagrad", "rowwise-adagrad", "adam", "sgd")
DENSE_OPTIMIZERS = ("adam", "adagrad", "sgd")
DEFAULT_CROSS_LAYERS = 3            # dcn: cross layers when --cross-layers is not given
DEFAULT_BOTTOM_HIDDEN = 64          # dlrm: bottom MLP (64, embedding_dim) when --bottom-mlp is not given
SPARSE_SYNCS = ("owner", "allreduce")
MPI_WAITS = ("auto", "spin", "yield")
PAGE_CACHE_MODES = ("direct", "dontneed", "keep")   # hps.ssd.SSDOptions.page_cache
#: Seeds are unsigned 64-bit integers (they are mixed into uint64 key hashes).
MAX_SEED = (1 << 64) - 1
#: Size suffixes, all binary: K = KB = KiB = 2**10 bytes, and so on (case-insensitive).
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text) -> int:
    """``"512MiB"`` = ``"512MB"`` = ``"512m"`` -> 536870912 (binary units K/M/G/T, with or without
    ``B``/``iB``); plain integers are bytes. Raises InvalidInputError."""
    if isinstance(text, numbers.Real) and not isinstance(text, bool):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(?:([KMGT])I?B?|B?)\s*", str(text).upper())
    if not m:
        raise InvalidInputError(f"cannot read {text!r} as a size; use e.g. 512MiB, 2GiB, 2g or a byte "
                                "count (binary units: 1KiB = 1KB = 1k = 1024 bytes)")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


#: Annotation -> (accepted types, how the error message says it). Bools are not numbers here.
_TYPES = {
    "int": (numbers.Integral, "an integer"),
    "float": (numbers.Real, "a finite number"),
    "bool": (bool, "true or false"),
    "str": ((str, os.PathLike), "a string"),
    "tuple[int, ...]": ((list, tuple), "a list of integers"),
}


def _type_ok(value, ann: str) -> bool:
    if isinstance(value, bool) and ann != "bool":
        return False
    if not isinstance(value, _TYPES[ann][0]):
        return False
    if ann == "float":
        return math.isfinite(value)
    if ann == "tuple[int, ...]":
        return all(_type_ok(v, "int") for v in value)
    return True


def _check_types(obj) -> None:
    """Checks every field of the dataclass ``obj`` against its annotation (a string such as
    ``"int | None"``); turns accepted ints of float fields into floats. Raises InvalidTypeError."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        anns = [a.strip() for a in f.type.split("|")]
        if value is None and "None" in anns:
            continue
        kinds = [a for a in anns if a != "None"]
        if not any(_type_ok(value, a) for a in kinds):
            want = " or ".join(_TYPES[a][1] for a in kinds) + (" (or unset)" if "None" in anns else "")
            raise InvalidTypeError(f"option {f.name.replace('_', '-')} must be {want}, got {value!r} "
                                   f"({type(value).__name__})")
        if kinds == ["float"]:
            setattr(obj, f.name, float(value))
        elif "int" in kinds and isinstance(value, numbers.Integral):
            setattr(obj, f.name, int(value))  # NumPy integers too
        elif "str" in kinds and isinstance(value, os.PathLike):
            setattr(obj, f.name, os.fspath(value))


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
    max_malformed: float = DEFAULT_MAX_MALFORMED  # fraction of malformed lines a pass may skip
    data_shards: int | None = None      # shards the data is cut into (None = one per rank)

    def __post_init__(self):
        _check_types(self)
        _one_of("format", self.format, FORMATS)
        _positive(self, "rows", "fields", "vocab_per_field", "zipf", "libsvm_fields", "data_shards")
        for name in ("fields", "libsvm_fields"):
            if getattr(self, name) is not None:
                check_n_fields(getattr(self, name), name.replace("_", "-"))
        if not 0.0 <= self.max_malformed <= 1.0:
            raise InvalidInputError(f"max-malformed must be a fraction in [0, 1], got {self.max_malformed}")
        if self.format != "synthetic" and not self.data:
            raise InvalidInputError(f"--format {self.format} needs --data FILE")


def check_architecture(model: str, embedding_dim: int, hidden, cross_layers, bottom_mlp) -> None:
    """The architecture checks shared by :class:`ModelOptions` and ``hps.model.ModelConfig``.
    ``cross_layers`` / ``bottom_mlp`` may be None (the model's default). Raises InvalidInputError."""
    _one_of("model", model, MODELS)
    if any(h <= 0 for h in hidden):
        raise InvalidInputError(f"hidden layer sizes must be positive, got {tuple(hidden)}")
    if cross_layers is not None and cross_layers < 1:
        raise InvalidInputError(f"cross-layers must be >= 1, got {cross_layers}")
    if bottom_mlp is not None:
        if not bottom_mlp or any(h <= 0 for h in bottom_mlp):
            raise InvalidInputError(f"bottom-mlp needs one or more positive widths, got {tuple(bottom_mlp)}")
        if bottom_mlp[-1] != embedding_dim:
            raise InvalidInputError(
                f"bottom-mlp must end at the embedding width {embedding_dim} (DLRM takes dot products of "
                f"its output with the embeddings), got {','.join(map(str, bottom_mlp))}; e.g. "
                f"--bottom-mlp {DEFAULT_BOTTOM_HIDDEN},{embedding_dim}")


def _widths(value):
    return None if value is None else tuple(int(h) for h in value)


@dataclass
class ModelOptions:
    """The model flags of a training run (``hps.model.ModelConfig`` is the architecture the trainer
    builds from them once the data's field counts are known)."""

    model: str = "ctr"                          # ctr | wdl | deepfm | dcn | dlrm (README "Models")
    embedding_dim: int = 16                     # per-field embedding width
    hidden: tuple[int, ...] = (128, 64)         # MLP hidden layers (ReLU); dcn: the deep tower
    cross_layers: int | None = None             # dcn only: cross layers (None = 3)
    bottom_mlp: tuple[int, ...] | None = None   # dlrm only: bottom MLP widths over the dense features,
                                                # ending at embedding_dim (None = 64,embedding_dim)
    top_mlp: tuple[int, ...] | None = None      # dlrm only: top MLP hidden widths (None = hidden)
    sparse_optimizer: str = "adagrad"           # adagrad | rowwise-adagrad | adam | sgd, on rows
    dense_optimizer: str = "adam"               # adam | adagrad | sgd, on the dense parameters
    lr: float = 0.2                             # sparse (embedding) learning rate
    dense_lr: float = 1e-3                      # dense (MLP) learning rate
    init_scale: float = 0.01                    # embeddings start uniform in [-s, s), from the key
    adagrad_init: float = 0.001                 # Adagrad accumulator of a new row; > 0 keeps the first
                                                # step smooth in the gradient, so runs that sum a
                                                # gradient in another order (N ranks) stay within 1e-5
                                                # (rows and dense Adagrad alike)
    emb_l2: float = 0.0                         # L2 on the rows a mini-batch uses: grad += emb_l2 * row

    def __post_init__(self):
        _check_types(self)
        self.hidden = _widths(self.hidden)
        self.bottom_mlp, self.top_mlp = _widths(self.bottom_mlp), _widths(self.top_mlp)
        check_architecture(self.model, self.embedding_dim, self.hidden, self.cross_layers, self.bottom_mlp)
        for flag, value, owner in (("cross-layers", self.cross_layers, "dcn"),
                                   ("bottom-mlp", self.bottom_mlp, "dlrm"), ("top-mlp", self.top_mlp, "dlrm")):
            if value is not None and self.model != owner:
                raise InvalidInputError(f"--{flag} is an option of --model {owner}, not of --model {self.model}")
        if self.top_mlp is not None and any(h <= 0 for h in self.top_mlp):
            raise InvalidInputError(f"top-mlp widths must be positive, got {self.top_mlp}")
        _one_of("sparse optimizer", self.sparse_optimizer, SPARSE_OPTIMIZERS)
        _one_of("dense optimizer", self.dense_optimizer, DENSE_OPTIMIZERS)
        _positive(self, "embedding_dim", "lr", "dense_lr", "init_scale")
        if self.adagrad_init < 0:
            raise InvalidInputError(f"adagrad-init must be >= 0, got {self.adagrad_init}")
        if not self.emb_l2 >= 0:
            raise InvalidInputError(f"emb-l2 must be >= 0, got {self.emb_l2}")


@dataclass
class TierConfig:
    device: str = "cpu"                 # where HBM-PS and the model live: cpu | cuda
    mem_budget: int | str | None = None  # MEM-PS DRAM budget: bytes or "512MiB"; None = 256 MiB
    ssd_path: str | None = None         # SSD-PS root (each rank claims rank{r}-of-{n}/ in it); None = a temp dir
    keep_ssd: bool = False              # keep this job's SSD-PS at the end (it is removed otherwise)
    rows_per_file: int = 16_384         # SSD-PS rows per parameter file (the write unit; loads read 4 KiB blocks)
    hbm_capacity: int | None = None     # HBM-PS keys; None = sized from the first batch
    n_parts: int = 1                    # HBM-PS parts (GPUs) per process
    ssd_page_cache: str = "direct"      # SSD-PS reads: direct (O_DIRECT) | dontneed | keep

    def __post_init__(self):
        _check_types(self)
        _one_of("device", self.device, DEVICES)
        _one_of("ssd-page-cache", self.ssd_page_cache, PAGE_CACHE_MODES)
        if self.mem_budget is not None:
            self.mem_budget = parse_bytes(self.mem_budget)
        _positive(self, "mem_budget", "rows_per_file", "hbm_capacity", "n_parts")


@dataclass
class TrainConfig:
    batch_size: int = 16_384            # examples per batch (the pipeline's unit), whole job
    minibatch_size: int = 1_024         # examples per synchronous update, whole job
    epochs: int = 1
    seed: int = 0                       # in [0, MAX_SEED = 2**64 - 1]
    queue_depth: int = 1                # items waiting between two pipeline stages
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0           # batches between checkpoints; 0 = end of every epoch only
    resume: bool = False                # continue from checkpoint_dir
    keep_checkpoints: int = 1           # complete checkpoints kept; --resume falls back to an older one
    export: str | None = None           # directory for the HDF5 export of the trained model
    metrics_out: str | None = None      # JSON metrics file
    plots: str | None = None            # directory for PNG figures (needs matplotlib)
    ranks_per_node: int | None = None   # MPI: override node grouping (tests: 4 ranks = 2 x 2)
    sparse_sync: str = "owner"          # MPI: owner (rows live at their owner) | allreduce (App. C.3)
    mpi_wait: str = "auto"              # MPI: spin | yield (poll with sleeps) | auto (yield if oversubscribed)
    progress: bool = True               # tqdm progress bar
    # FAE (README "FAE"): a profile file from python -m hps.profile, or "auto" (profile first)
    fae: str | None = None
    hot_bytes: int | str | None = None  # FAE: HBM-PS bytes for the pinned hot rows ("auto" needs it)
    fae_sample_rate: float = 5.0        # FAE auto: percent of the input the profiler reads
    fae_holdout: int = 1024             # FAE: held-out eval examples for the Shuffle Scheduler's loss

    def __post_init__(self):
        _check_types(self)
        _positive(self, "batch_size", "minibatch_size", "epochs", "queue_depth", "ranks_per_node",
                  "keep_checkpoints")
        _one_of("sparse-sync", self.sparse_sync, SPARSE_SYNCS)
        _one_of("mpi-wait", self.mpi_wait, MPI_WAITS)
        if not 0 <= self.seed <= MAX_SEED:
            raise InvalidInputError(f"seed must be an integer in [0, 2**64 - 1], got {self.seed}")
        if self.checkpoint_every < 0:
            raise InvalidInputError("checkpoint-every must be >= 0")
        if self.minibatch_size > self.batch_size:
            raise InvalidInputError(f"minibatch-size ({self.minibatch_size}) must not exceed batch-size "
                                    f"({self.batch_size})")
        if self.resume and not self.checkpoint_dir:
            raise InvalidInputError("--resume needs --checkpoint-dir")
        if self.hot_bytes is not None:
            self.hot_bytes = parse_bytes(self.hot_bytes)
            if self.hot_bytes < 0:
                raise InvalidInputError(f"hot-bytes must be >= 0, got {self.hot_bytes}")
        if self.fae == "auto" and self.hot_bytes is None:
            raise InvalidInputError("--fae auto needs --hot-bytes SIZE (HBM-PS bytes for the hot rows)")
        if self.fae is None and self.hot_bytes is not None:
            raise InvalidInputError("--hot-bytes is an option of --fae (give --fae auto or --fae PROFILE)")
        if not 0.0 < self.fae_sample_rate <= 100.0:
            raise InvalidInputError(f"fae-sample-rate must be a percentage in (0, 100], got {self.fae_sample_rate}")
        if self.fae_holdout < 0:
            raise InvalidInputError(f"fae-holdout must be >= 0, got {self.fae_holdout}")


#: TOML sections (``[data]`` …): the subsystem whose options each may hold.
SECTIONS = {"data": DataConfig, "model": ModelOptions, "tiers": TierConfig, "train": TrainConfig}
#: Switches that may also be written negated, as their flag is: ``no_progress = true``.
_NEGATED = {"no_progress": "progress"}


def _names(cls) -> set[str]:
    return {f.name for f in fields(cls)}


def flatten_options(values: dict) -> dict:
    """``{option: value}`` with dashes turned into underscores, sections (a dict value under a
    ``SECTIONS`` name, i.e. a TOML table) merged in after checking that each of their keys belongs to
    that subsystem, and negated switches (``no-progress = true``) resolved. Raises InvalidInputError."""
    flat: dict = {}
    seen: dict = {}

    def put(key, value, where):
        key = key.replace("-", "_")
        if key in _NEGATED:
            if not isinstance(value, bool):
                raise InvalidTypeError(f"option {key.replace('_', '-')} must be true or false, got "
                                       f"{value!r} ({type(value).__name__})")
            key, value = _NEGATED[key], not value
        if key in flat:
            raise InvalidInputError(f"option {key.replace('_', '-')} is given twice ({seen[key]} and "
                                    f"{where})")
        flat[key], seen[key] = value, where

    for key, value in values.items():
        if not isinstance(value, dict):
            put(key, value, "at the top level")
            continue
        section = key.replace("-", "_")
        cls = SECTIONS.get(section)
        if cls is None:
            names = ", ".join(f"[{n}]" for n in SECTIONS)
            raise InvalidInputError(f"unknown section [{key}]; sections are {names} (or write the keys at "
                                    "the top level)")
        for k, v in value.items():
            name = k.replace("-", "_")
            name = _NEGATED.get(name, name)
            if name not in _names(cls):
                home = [n for n, c in SECTIONS.items() if name in _names(c)]
                hint = f" (it belongs in [{home[0]}])" if home else ""
                raise InvalidInputError(f"[{key}] has no option {k}{hint}")
            put(k, v, f"in [{key}]")
    return flat


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelOptions = field(default_factory=ModelOptions)
    tiers: TierConfig = field(default_factory=TierConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @staticmethod
    def from_flat(values: dict) -> "Config":
        """Build from ``{option: value}`` (CLI flags / TOML keys, dashes or underscores; sections and
        negated switches as in :func:`flatten_options`)."""
        values = flatten_options(values)
        parts = {}
        for name, cls in SECTIONS.items():
            own = _names(cls)
            parts[name] = cls(**{k: values.pop(k) for k in list(values) if k in own})
        if values:
            raise InvalidInputError(f"unknown option(s): {', '.join(sorted(values))}")
        return Config(**parts)
