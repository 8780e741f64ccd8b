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
from dataclasses import dataclass, field, fields, replace

from .data import DENSE_TRANSFORMS
from .data._batch import check_n_fields
from ._data_options import FORMATS, resolve_format
from ._xp import DEVICES
from .errors import InvalidInputError, InvalidTypeError

MODELS = ("ctr", "wdl", "deepfm", "dcn", "dlrm")
SPARSE_OPTIMIZERS = ("adagrad", "rowwise-adagrad", "adam", "sgd")
DENSE_OPTIMIZERS = ("adam", "adagrad", "sgd")
DEFAULT_CROSS_LAYERS = 3            # dcn: cross layers when --cross-layers is not given
DEFAULT_BOTTOM_HIDDEN = 64          # dlrm: bottom MLP (64, embedding_dim) when --bottom-mlp is not given
SPARSE_SYNCS = ("owner", "allreduce")
DENSE_SYNCS = ("allreduce", "easgd")
COMPRESS_MODES = ("none", "bf16", "int8")
CONSISTENCIES = ("bsp", "het")      # --consistency (HET: hps/train/_het.py)
HET_POLICIES = ("lfu", "lru")
#: ``--staleness inf``: a clock bound no gap reaches (int64 clock arithmetic stays exact).
STALENESS_UNBOUNDED = 1 << 60
MPI_WAITS = ("auto", "spin", "yield")
PAGE_CACHE_MODES = ("direct", "dontneed", "keep")   # hps.ssd.SSDOptions.page_cache
LR_DECAYS = ("none", "cosine", "step")              # --lr-decay (hps/train/_schedule.py)
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
    "tuple[str, ...]": ((list, tuple), "a list of strings"),
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
    if ann == "tuple[str, ...]":
        return all(_type_ok(v, "str") for v in value)
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


#: ``dataclasses.field`` metadata key: an option's value in the kernel warm-up's scratch job
#: (:func:`scratch_config`), a value or ``form(value, scratch) -> value``; options without one keep theirs.
#: The form is declared with the option (:func:`_warm`), so a new option says at once what the warm-up
#: does with it.
WARMUP = "warmup"


def _warm(default, form):
    """An option whose warm-up form is ``form`` (see :data:`WARMUP`)."""
    return field(default=default, metadata={WARMUP: form})


@dataclass(frozen=True)
class Scratch:
    """The sizes of the warm-up's scratch job: ``examples`` per batch, ``mem_budget`` the job's budget."""

    examples: int
    mem_budget: int


def _scratch_batch(value, scratch: Scratch) -> int:
    return scratch.examples


def _scratch_minibatch(value, scratch: Scratch) -> int:
    return min(value, scratch.examples // 2)


def _scratch_budget(value, scratch: Scratch) -> int:
    return scratch.mem_budget


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
    mem_budget: int | str | None = _warm(None, _scratch_budget)  # a rank's host memory: bytes or "512MiB"; None = from the machine
    ssd_path: str | None = _warm(None, None)  # SSD-PS root (each rank claims rank{r}-of-{n}/ in it); None = a temp dir
    keep_ssd: bool = _warm(False, False)  # keep this job's SSD-PS at the end (it is removed otherwise)
    rows_per_file: int = 16_384         # SSD-PS rows per parameter file (the write unit; loads read 4 KiB blocks)
    hbm_capacity: int | None = _warm(None, None)  # HBM-PS initial keys (grows); None = sized from the first batch
    n_parts: int = 1                    # HBM-PS parts per process
    gpus: int | None = None             # GPUs the parts spread over (part p on p % gpus); None = all visible
    ssd_page_cache: str = "direct"      # SSD-PS reads: direct (O_DIRECT) | dontneed | keep

    def __post_init__(self):
        _check_types(self)
        _one_of("device", self.device, DEVICES)
        _one_of("ssd-page-cache", self.ssd_page_cache, PAGE_CACHE_MODES)
        if self.mem_budget is not None:
            self.mem_budget = parse_bytes(self.mem_budget)
        _positive(self, "mem_budget", "rows_per_file", "hbm_capacity", "n_parts", "gpus")


@dataclass
class TrainConfig:
    """The training options, one group per feature, each group validated by its own check
    (:data:`FEATURE_CHECKS`); each option says what the kernel warm-up does with it (:data:`WARMUP`)."""

    batch_size: int = _warm(16_384, _scratch_batch)  # examples per batch (the pipeline's unit), whole job
    minibatch_size: int = _warm(1_024, _scratch_minibatch)  # examples per synchronous update, whole job
    epochs: int = _warm(1, 1)
    seed: int = 0                       # in [0, MAX_SEED = 2**64 - 1]
    queue_depth: int = 1                # items waiting between two pipeline stages
    blas_threads: int | None = None     # BLAS pool while training; None = cores per rank - 1 (>= 1)
    checkpoint_dir: str | None = _warm(None, None)
    checkpoint_every: int = _warm(0, 0)  # batches between checkpoints; 0 = end of every epoch only
    resume: bool = _warm(False, False)  # continue from checkpoint_dir
    keep_checkpoints: int = 1           # complete checkpoints kept; --resume falls back to an older one
    export: str | None = _warm(None, None)  # directory for the HDF5 export of the trained model
    metrics_out: str | None = _warm(None, None)  # JSON metrics file
    plots: str | None = _warm(None, None)  # directory for PNG figures (needs matplotlib)
    ranks_per_node: int | None = None   # MPI: override node grouping (tests: 4 ranks = 2 x 2)
    sparse_sync: str = "owner"          # MPI: owner (rows live at their owner) | allreduce (App. C.3)
    mpi_wait: str = "auto"              # MPI: spin | yield (poll with sleeps) | auto (yield if oversubscribed)
    progress: bool = _warm(True, False)  # tqdm progress bar
    # -- Hierarchical Training (Huang et al., KDD 2021, §3.1; hps/train/_easgd.py, hps/comm/_compress.py) --
    dense_sync: str = "allreduce"       # MPI: allreduce (one dense copy, BSP) | easgd (groups + background EASGD)
    groups: int = 1                     # easgd: contiguous rank groups, one dense copy each
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
    # FAE (README "FAE"): a profile file from python -m hps.profile, or "auto" (profile first)
    fae: str | None = _warm(None, None)  # (the warm-up profiles nothing)
    hot_bytes: int | str | None = _warm(None, None)  # FAE: HBM-PS bytes for the pinned hot rows ("auto" needs it)
    fae_sample_rate: float = 5.0        # FAE auto: percent of the input the profiler reads
    fae_holdout: int = 1024             # FAE: held-out eval examples for the Shuffle Scheduler's loss

    def __post_init__(self):
        _check_types(self)
        _positive(self, "batch_size", "minibatch_size", "epochs", "queue_depth", "blas_threads", "ranks_per_node",
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
        if self.shuffle_buffer < 0:
            raise InvalidInputError(f"shuffle-buffer must be >= 0, got {self.shuffle_buffer}")
        for check in FEATURE_CHECKS:
            check(self)


def _non_negative(t, *names) -> None:
    for name in names:
        if getattr(t, name) < 0:
            raise InvalidInputError(f"{name.replace('_', '-')} must be >= 0, got {getattr(t, name)}")


def _check_admission(t: "TrainConfig") -> None:
    """--admit-after, --admit-sketch-width, --expire-after (the owner of a key decides: owner sync)."""
    _non_negative(t, "admit_after", "expire_after")
    w = t.admit_sketch_width
    if w < 16 or w & (w - 1):
        raise InvalidInputError(f"admit-sketch-width must be a power of two >= 16, got {w}")
    if (t.admit_after > 1 or t.expire_after) and t.sparse_sync != "owner":
        raise InvalidInputError("--admit-after and --expire-after need --sparse-sync owner (the owner of "
                                "a key decides)")


def _check_control(t: "TrainConfig") -> None:
    """--eval-every, --early-stop (eval data is checked when the job's data is open)."""
    _non_negative(t, "eval_every", "early_stop")
    if t.early_stop and not t.eval_every:
        raise InvalidInputError("--early-stop needs --eval-every N (and eval data)")


def _check_schedule(t: "TrainConfig") -> None:
    """--lr-warmup, --lr-decay, --lr-decay-steps."""
    _non_negative(t, "lr_warmup", "lr_decay_steps")
    _one_of("lr-decay", t.lr_decay, LR_DECAYS)
    if t.lr_decay != "none" and t.lr_decay_steps < 1:
        raise InvalidInputError(f"--lr-decay {t.lr_decay} needs --lr-decay-steps N (steps = global "
                                "mini-batches)")


def _check_fae(t: "TrainConfig") -> None:
    """--fae, --hot-bytes (-> int bytes), --fae-sample-rate, --fae-holdout; FAE needs BSP and raw keys."""
    if t.hot_bytes is not None:
        t.hot_bytes = parse_bytes(t.hot_bytes)
        if t.hot_bytes < 0:
            raise InvalidInputError(f"hot-bytes must be >= 0, got {t.hot_bytes}")
    if t.fae == "auto" and t.hot_bytes is None:
        raise InvalidInputError("--fae auto needs --hot-bytes SIZE (HBM-PS bytes for the hot rows)")
    if t.fae is None and t.hot_bytes is not None:
        raise InvalidInputError("--hot-bytes is an option of --fae (give --fae auto or --fae PROFILE)")
    if not 0.0 < t.fae_sample_rate <= 100.0:
        raise InvalidInputError(f"fae-sample-rate must be a percentage in (0, 100], got {t.fae_sample_rate}")
    if t.fae_holdout < 0:
        raise InvalidInputError(f"fae-holdout must be >= 0, got {t.fae_holdout}")
    if t.fae is not None and t.consistency != "bsp":
        raise InvalidInputError("--fae pins hot rows on every rank and synchronises them each mini-batch: "
                                "it needs --consistency bsp")
    if t.fae is not None and t.admit_after > 1:
        raise InvalidInputError("--fae classifies raw keys as hot before admission could replace them: "
                                "drop --admit-after or --fae")


def _check_het(t: "TrainConfig") -> None:
    """--consistency, --staleness (-> int), --het-cache (-> a float fraction or int bytes),
    --het-policy; HET caches rows of their owners (owner sync) and sends them uncompressed."""
    _one_of("consistency", t.consistency, CONSISTENCIES)
    _one_of("het-policy", t.het_policy, HET_POLICIES)
    if isinstance(t.staleness, str):
        if t.staleness.strip().lower() not in ("inf", "infinity"):
            try:
                t.staleness = int(t.staleness)
            except ValueError:
                raise InvalidInputError(f"staleness must be an integer >= 0 or inf, got {t.staleness!r}") from None
        else:
            t.staleness = STALENESS_UNBOUNDED
    if not 0 <= t.staleness <= STALENESS_UNBOUNDED:
        raise InvalidInputError(f"staleness must be an integer >= 0 or inf, got {t.staleness}")
    cache = t.het_cache
    if isinstance(cache, str) and re.fullmatch(r"\s*[0-9]*\.[0-9]+\s*|\s*0\s*", cache):
        cache = float(cache)
    if isinstance(cache, float):
        if not 0.0 <= cache <= 1.0:
            raise InvalidInputError(f"het-cache must be a fraction in [0, 1] of the table or a size such as "
                                    f"64MiB, got {t.het_cache}")
        t.het_cache = cache
    else:
        t.het_cache = parse_bytes(cache)
        if t.het_cache < 0:
            raise InvalidInputError(f"het-cache must be >= 0, got {t.het_cache}")
    if t.consistency == "het" and t.sparse_sync != "owner":
        raise InvalidInputError("--consistency het caches rows of their owners: it needs --sparse-sync owner")
    if t.consistency == "het" and t.compress != "none":
        raise InvalidInputError("--compress applies to the BSP exchanges; --consistency het sends its rows and "
                                "pushes uncompressed: drop --compress or use --consistency bsp")


def _check_dense_sync(tc) -> None:
    """--dense-sync, --groups, --easgd-alpha, --easgd-every, --compress (the group count against the
    ranks is checked when the job's ranks are known)."""
    _positive(tc, "groups", "easgd_every")
    _one_of("dense-sync", tc.dense_sync, DENSE_SYNCS)
    _one_of("compress", tc.compress, COMPRESS_MODES)
    if tc.groups > 1 and tc.dense_sync != "easgd":
        raise InvalidInputError(f"--groups {tc.groups} needs --dense-sync easgd")
    if tc.easgd_alpha is not None and not 0 < tc.easgd_alpha * tc.groups <= 1:
        raise InvalidInputError(f"easgd-alpha x groups must lie in (0, 1] (the centre moves by alpha times the "
                                f"sum of the groups' differences), got {tc.easgd_alpha} x {tc.groups}")


#: Every feature's option check, each refusing the combinations that cannot work with its reason.
FEATURE_CHECKS = (_check_admission, _check_control, _check_schedule, _check_dense_sync, _check_het, _check_fae)

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
