"""The data one rank trains on: its shards, composed into local batches of local mini-batches.

Sizes are global, reading is local (DESIGN.md). The data is cut into ``K`` shards (``--data-shards``,
default one per rank; ``hps.data._shards``): line-aligned byte ranges or whole files, or rows of the
synthetic data. Rank ``r`` of ``N`` reads shards ``r K/N … (r+1) K/N - 1`` and nothing else.

A global batch holds the global mini-batches of sizes :func:`minibatch_sizes`; shard ``s``
contributes ``share_bounds(size_j, s, K)`` examples to global mini-batch ``j``, so its own batches
have ``sum_j`` of those examples and are cut into its local mini-batches in the same way. **Global
mini-batch j is the concatenation, in shard order, of every shard's j-th local mini-batch.** A
rank's :class:`LocalBatch` lays out its shards' local mini-batches mini-batch by mini-batch (its
local mini-batch ``j`` is one contiguous slice), so one process reading all ``K`` shards builds
exactly the global mini-batches that ``K`` ranks train on together. A shard that has run out adds
empty local mini-batches; the trainer's read stage agrees with the other ranks on when the epoch ends.

Each shard's reader parses (or generates) with ``--readers`` threads (``hps.data._parallel``: the
same batches for any number); by default :func:`reader_threads` of the rank's cores.

Not thread-safe: the read stage iterates :meth:`Feed.epoch`; evaluation runs after training.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..data import Batch, HashedReader, ReaderStats, format_options, open_dataset, share_bounds
from ..data._dense import LARGE as DENSE_LARGE
from ..errors import InvalidInputError
from ._shuffle import shuffled


#: Cores a rank leaves to the pipeline's other stages (prepare, place, train) when it picks its readers.
OTHER_STAGE_CORES = 3
#: Most readers a rank picks by default (8 readers make synthetic batches at several M examples/s).
MAX_DEFAULT_READERS = 8


def reader_threads(requested: int | None, cores_per_rank: int) -> int:
    """Reader threads of a rank: ``requested`` (``--readers``), else its cores minus the
    ``OTHER_STAGE_CORES`` the other stages need, between 1 and ``MAX_DEFAULT_READERS``."""
    if requested is not None:
        return int(requested)
    return max(1, min(MAX_DEFAULT_READERS, int(cores_per_rank) - OTHER_STAGE_CORES))


def minibatch_sizes(batch_size: int, minibatch_size: int) -> np.ndarray:
    """(P,) int64 sizes of the global mini-batches of a full global batch (the last may be shorter)."""
    full, rest = divmod(int(batch_size), int(minibatch_size))
    return np.array([minibatch_size] * full + ([rest] if rest else []), dtype=np.int64)


def shard_minibatch_sizes(sizes: np.ndarray, shard: int, n_shards: int) -> np.ndarray:
    """(P,) int64 examples shard ``shard`` of ``n_shards`` gives to each global mini-batch of ``sizes``."""
    spans = [share_bounds(int(g), shard, n_shards) for g in sizes]
    return np.array([b - a for a, b in spans], np.int64)


def empty_batch(n_fields: int, n_dense: int) -> Batch:
    return Batch(np.empty(0, np.float32), np.empty((0, n_dense), np.float32), np.empty(0, np.uint64),
                 np.empty(0, np.int32), np.empty(0, np.float32), np.zeros(1, np.int64), n_fields)


@dataclass
class LocalBatch:
    """This rank's part of one global batch: ``data`` holds its local mini-batches back to back,
    local mini-batch ``j`` being examples ``bounds[j]:bounds[j + 1]`` (bounds (P + 1,) int64).
    ``shard_counts`` (S, P) int64: the examples each of this rank's S shards gives to each local
    mini-batch (shard order inside it), or None with one shard (or once a feature regrouped them)."""

    data: Batch
    bounds: np.ndarray
    shard_counts: np.ndarray | None = None

    @property
    def counts(self) -> np.ndarray:
        """(P,) int64 examples of each local mini-batch."""
        return np.diff(self.bounds)

    def minibatch(self, j: int) -> Batch:
        return self.data.slice(int(self.bounds[j]), int(self.bounds[j + 1]))

    def shard_bounds(self, j: int) -> np.ndarray | None:
        """(S + 1,) int64 bounds of the shards' examples inside local mini-batch ``j``, or None (one
        shard): the ranks' shares that one process reading S shards trains apart (``_backend``)."""
        if self.shard_counts is None:
            return None
        return np.concatenate([[0], np.cumsum(self.shard_counts[:, j])]).astype(np.int64)


class Feed:
    """The shards of rank ``rank`` of ``size`` (``cfg``: the training Config), composed as above;
    ``cores_per_rank`` sets the default number of readers (None: this machine's cores).

    Raises InvalidInputError when ``--data-shards`` is not a multiple of the ranks or exceeds the
    mini-batch size (a shard would have no place in a mini-batch), when a shard's first bytes
    already show its data is unusable (``probe``), and when the eval data lacks a column the
    training data's fields or dense features come from (CSV/Parquet columns are matched by name).
    """

    def __init__(self, cfg, rank: int, size: int, cores_per_rank: int | None = None):
        d, tc = cfg.data, cfg.train
        k = d.data_shards or size
        if k % size:
            raise InvalidInputError(f"--data-shards {k} must be a multiple of the number of ranks ({size})")
        if k > tc.minibatch_size:
            raise InvalidInputError(f"--data-shards {k} is more than the mini-batch size ({tc.minibatch_size}): "
                                    "every shard needs a place in every mini-batch")
        self.n_shards = k
        self.shards = list(range(rank * k // size, (rank + 1) * k // size))
        self.shuffle_buffer, self.seed = tc.shuffle_buffer, tc.seed  # --shuffle-buffer (_shuffle)
        self.sizes = minibatch_sizes(tc.batch_size, tc.minibatch_size)
        self._local = [shard_minibatch_sizes(self.sizes, s, k) for s in self.shards]
        opts = format_options(d, tc.seed, tc.batch_size)
        self.format_options = opts  # the readers' options (the export records them)
        self.reader_threads = reader_threads(d.readers, cores_per_rank or os.cpu_count() or 1)
        read = {"strict": d.strict, "max_malformed": d.max_malformed, "readers": self.reader_threads}
        first = open_dataset(d.data, d.format, int(self._local[0].sum()), shard=(self.shards[0], k), **read, **opts)
        # data converted by hps.convert holds the keys of its source: the export names the source's format
        self.source = (first.source["format"], dict(first.source["options"])) if hasattr(first, "source") else None
        if getattr(first, "dense_stats", None) is not None:  # standardize: every shard and the eval data alike
            opts["dense_stats"] = first.dense_stats
        self.readers = [first] + [open_dataset(d.data, d.format, int(local.sum()), shard=(s, k), **read, **opts)
                                  for s, local in zip(self.shards[1:], self._local[1:])]
        self.n_fields, self.n_dense = first.n_fields, first.n_dense
        self._eval, self.eval_options = None, None
        if d.eval_data:
            eopts = {key: v for key, v in opts.items() if key not in ("seed", "block_rows")}
            if d.format == "libsvm":  # positional fields: the eval data has the training data's
                eopts["n_fields"] = self.n_fields
            if d.format in ("csv", "parquet"):  # columns by name: the training data's fields, in its order;
                eopts.update(categorical_columns=list(first.categorical_columns), ignore_columns=())  # others ignored
            self.eval_options = eopts  # also FAE's held-out examples (_fae)
            try:
                self._eval = [open_dataset(d.eval_data, d.format, int(local.sum()), shard=(s, k), **read, **eopts)
                              for s, local in zip(self.shards, self._local)]
            except InvalidInputError as e:  # e.g. a column the training data's fields come from is missing
                raise type(e)(f"--eval-data: {e}") from None
            ev = self._eval[0]
            if (ev.n_fields, ev.n_dense) != (self.n_fields, self.n_dense):
                raise InvalidInputError(f"--eval-data {d.eval_data} has {ev.n_fields} fields and {ev.n_dense} "
                                        f"dense features, --data {d.data} has {self.n_fields} and {self.n_dense}")
        if d.op_osrp:  # --op-osrp BINS: every parsed batch is hashed before training (hps.data._oposrp)
            self.readers = [HashedReader(r, d.op_osrp, tc.seed) for r in self.readers]
            self._eval = self._eval and [HashedReader(r, d.op_osrp, tc.seed) for r in self._eval]
        for r in self.readers + (self._eval or []):  # unusable data fails now, not after training
            r.probe()
        self.warnings = _dense_warnings(self.readers, d)
        self._parsed = 0

    @classmethod
    def replay(cls, batches: list, n_fields: int, n_dense: int, minibatch_size: int) -> "Feed":
        """A one-shard feed that replays ``batches`` (a list of Batches, none longer than the first),
        with no eval data (the warm-up's scratch job)."""
        feed = cls.__new__(cls)
        feed.n_shards, feed.shards, feed.reader_threads, feed.warnings, feed.source = 1, [0], 1, [], None
        feed.shuffle_buffer, feed.seed = 0, 0
        feed.sizes = minibatch_sizes(len(batches[0]), minibatch_size)
        feed._local = [feed.sizes]
        feed.readers = [_Replay(batches, n_fields, n_dense)]
        feed.n_fields, feed.n_dense = n_fields, n_dense
        feed._eval, feed._parsed = None, 0
        return feed

    @property
    def local_minibatch_sizes(self) -> np.ndarray:
        """(P,) int64 examples this rank's shards give to each mini-batch of a whole batch."""
        return np.sum(self._local, axis=0)

    @property
    def has_eval(self) -> bool:
        """Whether there is eval data (a file, or the synthetic eval split)."""
        return self._eval is not None or self.synthetic is not None

    def malformed(self) -> tuple[int, list[str]]:
        """(malformed lines, the first of them as "file:line: reason") of this rank's last pass."""
        return _malformed(self.readers)

    def eval_malformed(self) -> tuple[int, list[str]]:
        return _malformed(self._eval or [])

    @property
    def synthetic(self):
        """The first shard's SyntheticData (for ``bayes_auc``), or None for file data."""
        return self.readers[0] if hasattr(self.readers[0], "bayes_auc") else None

    @property
    def total_rows(self) -> int | None:
        """Examples of one pass over the whole data when known up front (synthetic data)."""
        rows = getattr(self.readers[0], "rows", None)
        return rows if isinstance(rows, int) else None

    @property
    def bytes_parsed(self) -> int:
        """Bytes this rank's readers handed to the parse kernels so far (every epoch)."""
        return self._parsed + sum(r.stats.bytes for r in self.readers)

    def empty(self) -> LocalBatch:
        return LocalBatch(empty_batch(self.n_fields, self.n_dense), np.zeros(len(self.sizes) + 1, np.int64))

    def epoch(self, epoch: int = 0) -> Iterator[LocalBatch]:
        """Local batches of pass ``epoch`` (its shuffle, with ``--shuffle-buffer``), until every
        shard of this rank has run out."""
        its = [r.batches() for r in self.readers]
        if self.shuffle_buffer:
            its = [shuffled(it, self.shuffle_buffer, self.seed, s, epoch) for it, s in zip(its, self.shards)]
        try:
            while True:
                parts = [next(it, None) for it in its]
                if all(p is None for p in parts):
                    break
                yield self._compose(parts)
        finally:  # also when abandoned: a suspended reader would hold its file open
            for it in its:
                getattr(it, "close", lambda: None)()
        self._parsed += sum(r.stats.bytes for r in self.readers)
        for r in self.readers:
            r.stats.bytes = 0

    def _compose(self, parts: list) -> LocalBatch:
        """Interleave the shards' batches mini-batch by mini-batch (shard order inside each)."""
        counts = np.zeros((len(parts), len(self.sizes)), np.int64)
        for i, (p, local) in enumerate(zip(parts, self._local)):
            if p is not None:  # a short last batch fills its mini-batches in order
                starts = np.concatenate([[0], np.cumsum(local)[:-1]])
                counts[i] = np.clip(len(p) - starts, 0, local)
        bounds = np.concatenate([[0], np.cumsum(counts.sum(axis=0))]).astype(np.int64)
        present = [p for p in parts if p is not None]
        if len(present) == 1 and len(parts) == 1:
            return LocalBatch(present[0], bounds)
        offs = np.concatenate([np.zeros((len(parts), 1), np.int64), np.cumsum(counts, axis=1)], axis=1)
        pieces = [parts[i].slice(int(offs[i, j]), int(offs[i, j + 1]))
                  for j in range(len(self.sizes)) for i in range(len(parts)) if counts[i, j]]
        data = Batch.concat(pieces) if pieces else empty_batch(self.n_fields, self.n_dense)
        return LocalBatch(data, bounds, counts if len(parts) > 1 else None)

    def eval_batches(self) -> Iterator[Batch]:
        """This rank's shards of the eval data (file, or synthetic's own split), one after the other."""
        if self._eval is not None:
            for r in self._eval:
                yield from r.batches()
        elif self.synthetic is not None:
            for r in self.readers:
                yield from r.eval_batches()


class _Replay:
    """A reader that replays a list of batches (nothing is parsed)."""

    def __init__(self, batches, n_fields: int, n_dense: int):
        self._batches, self.n_fields, self.n_dense = batches, n_fields, n_dense
        self.stats = ReaderStats()

    def batches(self, start_batch: int = 0):
        return iter(self._batches[start_batch:])


def _dense_warnings(readers, d) -> list[str]:
    """A warning when raw dense values are large enough to saturate the model (``hps.data._dense``)."""
    big = max((getattr(r, "probe_dense_max", 0.0) for r in readers), default=0.0)
    if big <= DENSE_LARGE or getattr(readers[0], "dense_transform", "none") != "none":
        return []
    return [f"dense values of --data reach {big:.3g} (beyond {DENSE_LARGE:g}): raw, they saturate the model's "
            "first layer and it may learn nothing from them; give --dense-transform log1p or standardize"]


def _malformed(readers) -> tuple[int, list[str]]:
    return (sum(r.stats.malformed for r in readers), [x for r in readers for x in r.stats.first_malformed()])
