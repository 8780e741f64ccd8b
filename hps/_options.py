"""The vocabulary of the job's options (``hps.config``): the enumerations a flag chooses from, sizes with
binary units, the check of every field against its annotation, and the kernel warm-up's form of an
option. Each enumeration is defined once: here, or by the library that owns it (``hps.comm``,
``hps.ssd``, ``hps._xp``, ``hps._data_options``) and named here.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from dataclasses import dataclass, field, fields

from .comm._compress import COMPRESS_MODES as COMM_COMPRESS_MODES
from .comm._wait import DEFAULT_WAIT, WAIT_MODES
from .errors import InvalidInputError, InvalidTypeError
from .ssd._fileio import PAGE_CACHE_MODES as STORE_PAGE_CACHE_MODES

MODELS = ("ctr", "wdl", "deepfm", "dcn", "dlrm")
SPARSE_OPTIMIZERS = ("adagrad", "rowwise-adagrad", "adam", "sgd")
DENSE_OPTIMIZERS = ("adam", "adagrad", "sgd")
DEFAULT_CROSS_LAYERS = 3            # dcn: cross layers when --cross-layers is not given
DEFAULT_BOTTOM_HIDDEN = 64          # dlrm: bottom MLP (64, embedding_dim) when --bottom-mlp is not given
SPARSE_SYNCS = ("owner", "allreduce")
DENSE_SYNCS = ("allreduce", "easgd")
COMPRESS_MODES = COMM_COMPRESS_MODES                # --compress (hps.comm)
CONSISTENCIES = ("bsp", "het")      # --consistency (HET: hps/train/_het.py)
HET_POLICIES = ("lfu", "lru")
#: ``--staleness inf``: a clock bound no gap reaches (int64 clock arithmetic stays exact).
STALENESS_UNBOUNDED = 1 << 60
MPI_WAITS = WAIT_MODES                              # --mpi-wait (hps.comm)
DEFAULT_MPI_WAIT = DEFAULT_WAIT                     # --mpi-wait's default (hps.comm.Waiter)
PAGE_CACHE_MODES = STORE_PAGE_CACHE_MODES           # --ssd-page-cache (hps.ssd.SSDOptions.page_cache)
LR_DECAYS = ("none", "cosine", "step")              # --lr-decay (hps/train/_schedule.py)
#: FAE profiler (``hps.profile``, seeds/003 §4.1.2): the paper's sample, n = 35 chunks of m = 1024 logger
#: entries; the percent of the input read (``--sample-rate``, ``--fae-sample-rate``) and the interval's
#: confidence.
CHUNKS = 35
CHUNK_ENTRIES = 1024
PROFILE_SAMPLE_RATE = 5.0
PROFILE_CONFIDENCE = 0.999
#: Share of the memory available to a rank (``hps.train._machine.memory_available()`` over the ranks
#: on its node) taken as its budget (``hps.train._budget``) when ``--mem-budget`` is not given. Half:
#: beside the budget the process holds what an empty job holds and its allocator's slack, the SSD-PS
#: reads through the page cache (which MemAvailable counts as free), and the node's other processes
#: keep running.
DEFAULT_BUDGET_FRACTION = 0.5
#: Examples per batch, whole job (``--batch-size``; the pipeline's unit). Synthetic data is generated per
#: batch, so hps.profile and hps.convert take the training job's value.
DEFAULT_BATCH_SIZE = 16_384
#: SSD-PS rows per parameter file of a training job (``--rows-per-file``; the SSD-PS write unit).
DEFAULT_ROWS_PER_FILE = 16_384
#: Seeds are unsigned 64-bit integers (they are mixed into uint64 key hashes).
MAX_SEED = (1 << 64) - 1
#: Size suffixes, all binary: K = KB = KiB = 2**10 bytes, and so on (case-insensitive).
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def format_bytes(n: float) -> str:
    """``n`` bytes as people read them ("1.5 GiB", "512 B"), the inverse of :func:`parse_bytes` to a tenth."""
    for unit, f in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{int(n)} B"


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
    """The sizes of the warm-up's scratch job: ``examples`` per batch, ``mem_budget`` the job's budget,
    ``hbm_budget`` an HBM-PS budget below the scratch job's table (rows leave it and come back);
    ``minibatch`` examples per mini-batch (None: half a batch, or the job's own if smaller)."""

    examples: int
    mem_budget: int
    hbm_budget: int
    minibatch: int | None = None


def _scratch_batch(value, scratch: Scratch) -> int:
    return scratch.examples


def _scratch_minibatch(value, scratch: Scratch) -> int:
    return min(value, scratch.examples // 2) if scratch.minibatch is None else scratch.minibatch


def _scratch_budget(value, scratch: Scratch) -> int:
    return scratch.mem_budget


def _scratch_hbm_budget(value, scratch: Scratch) -> int:
    return scratch.hbm_budget


