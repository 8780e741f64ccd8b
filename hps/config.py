"""Configuration of a training job: one dataclass per part of the job (data, model options, tiers,
training), composed into :class:`Config`; each validated on construction.

These are the job's flags, not the libraries' own settings: the trainer builds the model and its
optimizers (through ``hps.model.ModelConfig.from_options``, once the data's field counts are known),
``hps.mem.MemPS`` and ``hps.ssd.SSDStore`` from these values (``hps.mem.MemConfig`` serves callers of
that library, not the job).

Only ``hps.cli`` parses arguments; everything else takes these objects. Sizes are global
(``batch_size``/``minibatch_size`` describe the whole job; under ``mpirun -np N`` each rank reads its
own shards of the data and contributes 1/N of every mini-batch).

Every field's value is checked against its annotation on construction (an integer, a number, true or
false, a string; ``| None`` = may be unset), so a TOML value of the wrong type is one clear
``InvalidTypeError`` naming the option.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from .data import DENSE_TRANSFORMS
from .data._batch import check_n_fields
from ._data_options import FORMATS, resolve_format  # noqa: F401 (FORMATS: named here for the job's users)
from ._feature_checks import FEATURE_CHECKS
# The options' vocabulary (``hps._options``), also named here for the job's users (``hps.config.MODELS`` …).
from ._options import (COMPRESS_MODES, CONSISTENCIES, DEFAULT_BATCH_SIZE, DEFAULT_BOTTOM_HIDDEN,  # noqa: F401
                       DEFAULT_CROSS_LAYERS, DEFAULT_ROWS_PER_FILE, DENSE_OPTIMIZERS, DENSE_SYNCS, HET_POLICIES,
                       LR_DECAYS, MAX_SEED, MODELS, DEFAULT_MPI_WAIT, MPI_WAITS, PAGE_CACHE_MODES, PROFILE_SAMPLE_RATE, SPARSE_OPTIMIZERS, SPARSE_SYNCS,
                       STALENESS_UNBOUNDED, WARMUP, Scratch, _check_types, _one_of, _positive, _scratch_batch,
                       _scratch_budget, _scratch_hbm_budget, _scratch_minibatch, _warm, parse_bytes)
from ._xp import DEVICES
from .errors import InvalidInputError, InvalidTypeError

@dataclass
class DataConfig:
    """The data of a job: ``format`` None is inferred; unset options take their format's defaults; an
    option of another format is an error (``hps._data_options.resolve_format``)."""

    format: str | None = None           # synthetic | criteo | libsvm | csv | parquet; None = inferred
    data: str | tuple[str, ...] | None = None       # training files, directories or globs, plain,
                                                    # .gz or .zst (not used by synthetic)
    eval_data: str | tuple[str, ...] | None = _warm(None, None)  # evaluation data, the same; synthetic has its own split
    rows: int | None = None             # synthetic: training examples
    fields: int | None = None           # synthetic: categorical fields
    vocab_per_field: int | None = None  # synthetic: distinct values per field
    zipf: float | None = None           # synthetic: Zipf exponent of value popularity
    n_dense: int | None = None          # synthetic: dense features
    label_column: str | None = None     # csv, parquet: the label column ("click")
    ignore_columns: tuple[str, ...] = ()    # csv, parquet: columns dropped (e.g. a row id)
    dense_columns: tuple[str, ...] = ()     # csv, parquet: numeric columns, the dense features in order
    categorical_columns: tuple[str, ...] | None = None  # csv, parquet: the fields in order (None = all others)
    int_as_categorical: bool = False    # criteo: also bucketize I1..I13 into fields 26..38
    libsvm_fields: int | None = None    # libsvm: positional fields (default: features on line 1)
    strict: bool = False                # first malformed line is an error instead of skipped
    max_malformed: float | None = None  # fraction of malformed lines a pass may skip (DEFAULT_MAX_MALFORMED)
    data_shards: int | None = None      # shards the data is cut into (None = one per rank)
    op_osrp: int | None = None          # hash every example's keys into 2 x this many binary features (OP+OSRP)
    drift: float | None = None          # synthetic: popularity ranks shifted per example (new keys over time)
    readers: int | None = None          # threads reading batches per rank (None = from its cores, hps.train._feed)
    dense_transform: str | None = None  # csv, parquet: none | log1p | standardize of the dense columns ("none")

    def __post_init__(self):
        _check_types(self)
        resolve_format(self)
        _positive(self, "rows", "fields", "vocab_per_field", "zipf", "libsvm_fields", "data_shards", "op_osrp",
                  "readers")
        if self.dense_transform is not None:
            _one_of("dense-transform", self.dense_transform, DENSE_TRANSFORMS)
        for name in ("fields", "libsvm_fields"):
            if getattr(self, name) is not None:
                check_n_fields(getattr(self, name), name.replace("_", "-"))
        if self.drift is not None and self.drift < 0:
            raise InvalidInputError(f"drift must be >= 0, got {self.drift}")
        if self.max_malformed is not None and not 0.0 <= self.max_malformed <= 1.0:
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

    model: str = "ctr"                          # ctr | wdl | deepfm | dcn | dlrm (docs/models.md)
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
    mem_budget: int | str | None = _warm(None, _scratch_budget)  # a rank's host memory: bytes or "512MiB"; None = from the machine
    ssd_path: str | None = _warm(None, None)  # SSD-PS root (each rank claims rank{r}-of-{n}/ in it); None = a temp dir
    keep_ssd: bool = _warm(False, False)  # keep this job's SSD-PS at the end (it is removed otherwise)
    rows_per_file: int = DEFAULT_ROWS_PER_FILE  # SSD-PS rows per file (the write unit; loads read 4 KiB blocks)
    hbm_capacity: int | None = _warm(None, None)  # HBM-PS initial keys (grows up to the budget); None = sized from the first batch
    hbm_budget: int | str | None = _warm(None, _scratch_hbm_budget)  # HBM-PS bytes (bounds resident rows); None = see hps/train/_budget.py
    n_parts: int = 1                    # HBM-PS parts per process
    gpus: int | None = None             # GPUs the parts spread over (part p on p % gpus); None = all visible
    ssd_page_cache: str = "direct"      # SSD-PS reads: direct (O_DIRECT) | dontneed | keep

    def __post_init__(self):
        _check_types(self)
        _one_of("device", self.device, DEVICES)
        _one_of("ssd-page-cache", self.ssd_page_cache, PAGE_CACHE_MODES)
        if self.mem_budget is not None:
            self.mem_budget = parse_bytes(self.mem_budget)
        if self.hbm_budget is not None:
            self.hbm_budget = parse_bytes(self.hbm_budget)
        _positive(self, "mem_budget", "rows_per_file", "hbm_capacity", "hbm_budget", "n_parts", "gpus")


@dataclass
class TrainConfig:
    """The training options, one group per feature, each group validated by its own check
    (:data:`FEATURE_CHECKS`); each option says what the kernel warm-up does with it (:data:`WARMUP`)."""

    batch_size: int = _warm(DEFAULT_BATCH_SIZE, _scratch_batch)  # examples per batch (the pipeline's unit), whole job
    minibatch_size: int = _warm(1_024, _scratch_minibatch)  # examples per synchronous update, whole job
    epochs: int = _warm(1, 1)
    seed: int = 0                       # in [0, MAX_SEED = 2**64 - 1]
    queue_depth: int = 1                # items waiting between two pipeline stages
    blas_threads: int | None = None     # dense model's threads while training; None = sized to idle cores
    gil_switch_interval: float | None = None  # seconds a thread may keep the GIL in training; None = the backend's
    checkpoint_dir: str | None = _warm(None, None)
    checkpoint_every: int = _warm(0, 0)  # batches between checkpoints; 0 = end of every epoch only
    resume: bool = _warm(False, False)  # continue from checkpoint_dir
    keep_checkpoints: int = 1           # complete checkpoints kept; --resume falls back to an older one
    export: str | None = _warm(None, None)  # directory for the HDF5 export of the trained model
    metrics_out: str | None = _warm(None, None)  # JSON metrics file
    plots: str | None = _warm(None, None)  # directory for PNG figures (needs matplotlib)
    ranks_per_node: int | None = None   # MPI: override node grouping (tests: 4 ranks = 2 x 2)
    sparse_sync: str = "owner"          # MPI: owner (rows live at their owner) | allreduce (App. C.3)
    mpi_wait: str = DEFAULT_MPI_WAIT    # MPI: spin | yield (poll with sleeps) | auto (yield if oversubscribed)
    progress: bool = _warm(True, False)  # tqdm progress bar
    # -- Hierarchical Training (Huang et al., KDD 2021, §3.1; hps/train/_easgd.py, hps/comm/_compress.py) --
    dense_sync: str = "allreduce"       # MPI: allreduce (one dense copy, BSP) | easgd (groups + background EASGD)
    groups: int = _warm(1, 1)           # easgd: contiguous rank groups, one dense copy each (the one-process warm-up: 1)
    easgd_alpha: float | None = None    # easgd: elastic moving rate (None = 0.9 / groups)
    easgd_every: int = 4                # easgd: mini-batches between EASGD rounds
    compress: str = "none"              # MPI traffic: none | bf16 | int8 (rows int8, gradients bf16)
    # -- admission and expiry (hps/train/_admission.py), training control (_control.py), schedules (_schedule.py)
    admit_after: int = 0                # a key gets its own row from its K-th occurrence on (0 = at once)
    admit_sketch_width: int = 1 << 20   # counters per row of each rank's count-min sketch (power of two)
    expire_after: int = 0               # delete keys unused for this many batches from every tier (0 = never)
    eval_every: int = _warm(0, 0)       # batches between evaluations during training (0 = at the end only)
    early_stop: int = _warm(0, 0)       # stop after this many evaluations without a better AUC (0 = never)
    lr_warmup: int = 0                  # steps (global mini-batches) of linear learning-rate warm-up
    lr_decay: str = "none"              # none | cosine | step, after the warm-up (dense and sparse)
    lr_decay_steps: int = 0             # cosine: steps down to 0; step: steps per x0.1 (needed with a decay)
    shuffle_buffer: int = 0             # examples of each data shard's seeded streaming shuffle (0 = off)
    # --consistency het (seed 001): per-rank caches of other ranks' rows, clock-bounded staleness
    consistency: str = "bsp"            # bsp (every mini-batch synchronous) | het
    staleness: int | str = 100          # het: clock bound s >= 0, or "inf"
    het_cache: int | float | str = "64MiB"  # het: per-rank cache, a fraction of the table (synthetic) or bytes
    het_policy: str = "lfu"             # het: cache eviction policy, lfu | lru
    # FAE (docs/fae.md): a profile file from python -m hps.profile, or "auto" (profile first)
    fae: str | None = _warm(None, None)  # (the warm-up profiles nothing)
    hot_bytes: int | str | None = _warm(None, None)  # FAE: HBM-PS bytes for the pinned hot rows ("auto" needs it)
    fae_sample_rate: float = PROFILE_SAMPLE_RATE  # FAE auto: percent of the input the profiler reads
    fae_holdout: int = 1024             # FAE: held-out eval examples for the Shuffle Scheduler's loss

    def __post_init__(self):
        _check_types(self)
        _positive(self, "batch_size", "minibatch_size", "epochs", "queue_depth", "blas_threads", "gil_switch_interval",
                  "ranks_per_node", "keep_checkpoints")
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
        if self.shuffle_buffer < 0:
            raise InvalidInputError(f"shuffle-buffer must be >= 0, got {self.shuffle_buffer}")
        for check in FEATURE_CHECKS:
            check(self)


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


def scratch_config(cfg: Config, scratch: Scratch) -> Config:
    """The kernel warm-up's scratch job of ``cfg``: every option with a warm-up form (:data:`WARMUP`)
    takes it (``scratch`` gives the sizes); the others keep their value. Validated like any Config."""
    parts = {}
    for name in SECTIONS:
        section = getattr(cfg, name)
        forms = {f.name: f.metadata[WARMUP] for f in fields(section) if WARMUP in f.metadata}
        parts[name] = replace(section, **{k: form(getattr(section, k), scratch) if callable(form) else form
                                          for k, form in forms.items()})
    return Config(**parts)
