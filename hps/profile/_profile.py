"""``profile()``: FAE's pre-processing (``seeds/003`` §4.1-4.2) -> a :class:`Profile`, and its HDF5 file.

1. **Input sampler** (§4.1.1): the data is cut into :data:`SAMPLER_BLOCKS` shards (line-aligned byte
   ranges, or rows of synthetic data; ``hps.data._shards``) and ``sample_rate`` % of them, drawn
   with ``seed``, are read; the rest is never opened, so profiling reads ~``sample_rate`` % of the bytes.
2. **Embedding logger**: the access count of every key of the sample (one hash pass, ``unique_counts``).
3. **Estimator** and **Statistical Optimizer** (Eq. 1-4, §4.1.3, ``_estimate``): the smallest access
   cutoff whose interval's upper end fits ``hot_bytes // row_bytes`` rows.
4. **Embedding classifier** (§4.2): the logger's keys with count >= cutoff are hot (when more than the
   budget, the most accessed ones, ties by key: ``truncated``). The hot-input fraction of the sample
   is measured with the input classifier (an input is hot iff all its keys are).
5. With ``exact``, the whole data is counted once more to get the **actual** number of keys at the
   same threshold (as a fraction of all accesses): at ``sample_rate`` 100 exactly the number the
   interval is about.

File format (``PROFILE_FORMAT``, version ``PROFILE_VERSION``; docs/formats.md, "FAE profile"): datasets
``hot_keys`` (h,) uint64 ascending and ``hot_counts`` (h,) int64 (sampled accesses), the rest attributes.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields

import numpy as np

from .._options import PROFILE_CONFIDENCE, PROFILE_SAMPLE_RATE
from .._written import written_whole
from ..data import open_dataset
from ..errors import InvalidInputError
from ..mem import unique_counts
from ._estimate import CHUNK_ENTRIES, CHUNKS, ChunkSample, search_threshold
from ._kernels import examples_all_hot

#: Shards the input sampler cuts the data into; it reads round(sample_rate % of them), at least one.
SAMPLER_BLOCKS = 200
#: Examples per batch while profiling (memory only; counts do not depend on it).
READ_BATCH = 65_536
#: HDF5 ``format`` attribute and version of a profile file. Never renumber.
PROFILE_FORMAT = "hps-fae-profile"
PROFILE_VERSION = 1


@dataclass
class Profile:
    """What ``profile`` found. ``hot_keys`` (h,) uint64 ascending, ``hot_counts`` (h,) int64 their
    sampled accesses; sizes in rows (keys) unless named bytes; ``actual`` is None without ``exact``."""

    hot_keys: np.ndarray
    hot_counts: np.ndarray
    threshold_count: int        # H: sampled accesses a hot key has at least (Eq. 1)
    threshold_fraction: float   # t = H / sampled accesses
    estimate: float             # estimated hot logger entries at H
    interval_low: float
    interval_high: float
    confidence: float
    sample_rate: float          # percent of the shards read
    chunks: int                 # n chunks drawn (0: every logger entry counted)
    chunk_entries: int          # m
    logged_entries: int         # distinct keys in the sample
    logged_hot: int             # logger entries with count >= H (before the budget cap)
    sampled_examples: int
    sampled_accesses: int
    hot_input_fraction: float   # of the sampled examples
    budget_rows: int
    row_bytes: int
    hot_bytes: int
    truncated: bool             # more keys passed H than fit: the most accessed were kept
    seed: int
    seconds: float              # profiling wall time (without the exact pass)
    actual: int | None = None   # with exact: keys of the whole data at threshold_fraction
    reader: str = ""            # the reader options that shaped the keys (reader_record; "": not recorded)

    @property
    def inside(self) -> bool | None:
        """Whether ``actual`` lies in the interval (None without it)."""
        return None if self.actual is None else bool(self.interval_low <= self.actual <= self.interval_high)

    def describe(self) -> str:
        exact = "" if self.actual is None else (
            f"; actual {self.actual:,} ({'inside' if self.inside else 'OUTSIDE'} the interval)")
        return (f"FAE profile: {self.hot_keys.shape[0]:,} hot keys (budget {self.budget_rows:,} rows of "
                f"{self.row_bytes} bytes), threshold {self.threshold_count} sampled accesses "
                f"(t = {self.threshold_fraction:.3g}); estimated hot size {self.estimate:,.0f}, "
                f"{100 * self.confidence:g} % interval [{self.interval_low:,.0f}, {self.interval_high:,.0f}]"
                f"{exact}; {100 * self.hot_input_fraction:.1f} % of {self.sampled_examples:,} sampled "
                f"inputs hot; {self.sample_rate:g} % sampled in {self.seconds:.2f} s")


def hot_mask(hot_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """(n,) bool: which ``keys`` (n,) uint64 are in ``hot_keys`` (h,) uint64 ascending."""
    if hot_keys.shape[0] == 0:
        return np.zeros(keys.shape[0], np.bool_)
    i = np.minimum(np.searchsorted(hot_keys, keys), hot_keys.shape[0] - 1)
    return hot_keys[i] == keys


def _read(data, fmt, shards, n_shards, fmt_options):
    """(keys (nnz,) uint64, offsets (n + 1,) int64) of the given shards, concatenated."""
    keys, sizes = [], []
    for s in shards:
        reader = open_dataset(data, fmt, READ_BATCH, shard=(int(s), n_shards), **fmt_options)
        for b in reader.batches():
            keys.append(b.keys)
            sizes.append(np.diff(b.offsets))
    k = np.concatenate(keys) if keys else np.empty(0, np.uint64)
    sz = np.concatenate(sizes) if sizes else np.empty(0, np.int64)
    return k, np.concatenate([[0], np.cumsum(sz)]).astype(np.int64)


def profile(data, fmt: str, hot_bytes: int, row_bytes: int, sample_rate: float = PROFILE_SAMPLE_RATE,
            confidence: float = PROFILE_CONFIDENCE, exact: bool = False, seed: int = 0, fmt_options: dict | None = None,
            chunks: int = CHUNKS, chunk_entries: int = CHUNK_ENTRIES) -> Profile:
    """Profile ``data`` (``fmt``, ``fmt_options`` as for ``hps.data.open_dataset``) for a hot set of at
    most ``hot_bytes`` (rows of ``row_bytes``): see the module docstring. Blocking; reads files.
    Raises InvalidInputError for bad arguments or data."""
    if not 0.0 < sample_rate <= 100.0:
        raise InvalidInputError(f"--sample-rate must be a percentage in (0, 100], got {sample_rate}")
    if hot_bytes < 0 or row_bytes <= 0:
        raise InvalidInputError(f"--hot-bytes must be >= 0 and the row size positive, got {hot_bytes}, {row_bytes}")
    opts = dict(fmt_options or {})
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    n_pick = max(1, min(SAMPLER_BLOCKS, round(SAMPLER_BLOCKS * sample_rate / 100.0)))
    shards = np.sort(rng.choice(SAMPLER_BLOCKS, size=n_pick, replace=False))
    keys, offsets = _read(data, fmt, shards, SAMPLER_BLOCKS, opts)
    if offsets.shape[0] == 1:
        raise InvalidInputError(f"the {sample_rate:g} % sample of {data} holds no example; raise --sample-rate")
    logged, counts, _ = unique_counts(keys)
    budget = int(hot_bytes) // int(row_bytes)
    sample = ChunkSample(counts, confidence, seed, chunks, chunk_entries)
    max_count = int(counts.max()) if counts.shape[0] else 0
    est = search_threshold(sample, budget, max_count)
    hot = counts >= est.cutoff
    logged_hot = int(hot.sum())
    hk, hc = logged[hot], counts[hot]
    truncated = hk.shape[0] > budget
    if truncated:  # the interval's bound held for the estimate, not for this draw: keep the most accessed
        order = np.lexsort((hk, -hc))[:budget]
        hk, hc = hk[order], hc[order]
    order = np.argsort(hk)
    hk, hc = hk[order], hc[order]
    hot_inputs = examples_all_hot(hot_mask(hk, keys), offsets)
    total = int(keys.shape[0])
    prof = Profile(hk, hc, est.cutoff, est.cutoff / max(total, 1), est.estimate, est.low, est.high,
                   float(confidence), float(sample_rate), 0 if sample.exact else sample.n, sample.m,
                   int(logged.shape[0]), logged_hot, int(offsets.shape[0] - 1), total,
                   float(hot_inputs.mean()), budget, int(row_bytes), int(hot_bytes), bool(truncated), int(seed),
                   time.perf_counter() - t0, reader=reader_record(fmt, opts))
    if exact:
        prof.actual = exact_hot_size(data, fmt, opts, est.cutoff, total)
    return prof


def exact_hot_size(data, fmt: str, fmt_options: dict, cutoff: int, sampled_accesses: int) -> int:
    """Keys of the whole data whose share of all accesses is at least ``cutoff / sampled_accesses``
    (the profile's threshold t): one full pass."""
    keys, _ = _read(data, fmt, [0], 1, fmt_options)
    _, counts, _ = unique_counts(keys)
    # count / T_full >= cutoff / T_sampled, in integers
    return int((counts.astype(np.float64) * sampled_accesses >= float(cutoff) * keys.shape[0]).sum())


# -- file ---------------------------------------------------------------------------------------------------
_ARRAYS = ("hot_keys", "hot_counts")


def write_profile(path, prof: Profile) -> None:
    """Write ``prof`` as HDF5 to ``path``: into a temporary file beside it, renamed over ``path`` once
    whole (an existing file is replaced then, never left half-written)."""
    with written_whole(path) as tmp:
        _write_profile(tmp, prof)


def _write_profile(path, prof: Profile) -> None:
    import h5py

    with h5py.File(path, "w") as f:
        f.attrs["format"], f.attrs["version"] = PROFILE_FORMAT, PROFILE_VERSION
        for name in _ARRAYS:
            f.create_dataset(name, data=getattr(prof, name))
        for k, v in asdict(prof).items():
            if k not in _ARRAYS:
                f.attrs[k] = -1 if (k == "actual" and v is None) else v


def read_profile(path) -> Profile:
    """The :class:`Profile` in ``path``. Raises InvalidInputError when it is missing or not a profile."""
    import h5py

    try:
        f = h5py.File(path, "r")
    except (OSError, FileNotFoundError):
        raise InvalidInputError(f"cannot open FAE profile {path}: make one with python -m hps.profile "
                                "(or train with --fae auto)") from None
    with f:
        if f.attrs.get("format") != PROFILE_FORMAT:
            raise InvalidInputError(f"{path} is not an FAE profile (no format={PROFILE_FORMAT} attribute)")
        if int(f.attrs["version"]) > PROFILE_VERSION:
            raise InvalidInputError(f"{path} is FAE profile version {int(f.attrs['version'])}; this hps reads "
                                    f"up to {PROFILE_VERSION}: upgrade hps or profile again")
        vals = {name: np.asarray(f[name][...]) for name in _ARRAYS}
        for fl in fields(Profile):
            if fl.name not in _ARRAYS and (fl.name in f.attrs or fl.name != "reader"):  # older: no reader
                v = f.attrs[fl.name]
                vals[fl.name] = v.item() if hasattr(v, "item") else v
    if vals["actual"] == -1:
        vals["actual"] = None
    vals["truncated"] = bool(vals["truncated"])
    return Profile(**vals)


def reader_record(fmt: str, fmt_options: dict | None) -> str:
    """The format and reader options that shape a data set's keys (all but the dense transform), as
    text a profile records and ``--fae PROFILE`` compares with its run's."""
    import json

    opts = {k: list(v) if isinstance(v, tuple) else v for k, v in (fmt_options or {}).items()
            if k != "dense_transform"}
    return json.dumps({"format": fmt, **opts}, sort_keys=True)


def digest(hot_keys: np.ndarray) -> str:
    """A short fingerprint of a hot-key set (checkpoints record it: resume needs the same hot set)."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(hot_keys, np.uint64).tobytes()).hexdigest()[:16]


def row_bytes_of(row_width: int, itemsize: int = 4) -> int:
    """HBM-PS bytes of one hot row: its floats and its uint64 key."""
    return int(row_width) * int(itemsize) + 8


__all__ = ["Profile", "profile", "write_profile", "read_profile", "hot_mask", "digest", "row_bytes_of",
           "exact_hot_size"]
