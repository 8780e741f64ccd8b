"""``plan_memory``: how one rank's memory budget is spent, decided before training starts.

The budget (``--mem-budget``, else ``DEFAULT_BUDGET_FRACTION`` of the memory available to the
rank: ``resolve_budget``) is the rank's host memory as a whole, beside what an empty job holds (the
interpreter, the imported libraries and the compiled kernels, about 0.3 GiB, which no setting
changes). ``plan_memory`` divides it into shares, printed at start:

- **model**: dense parameters, their gradients and optimizer state, one mini-batch's activations
  and their gradients (``_preflight.memory_floor``);
- **HBM-PS twin** (``--device cpu``): the CPU hash table of the HBM-PS, a cache across batches
  bounded by ``--hbm-budget``, at its first size (``hbm_bytes`` of the working sets of ``2 (window +
  1)`` first batches); it grows up to the budget as rows stay resident, and its growth is charged to
  the MEM-PS tier (:class:`TwinBudget`). By default the budget is the twin's share
  (``_hbm_budget.twin_share_budget``): its last growth takes at most ``_hbm_budget.TWIN_SHARE`` of
  what the tier can spare beyond its floor (:func:`tier_floor`: one batch's owned working set and
  the SSD-PS index of their table), so the tier keeps that floor at every growth; never less than
  ``2 (window + 1)`` working sets of the largest batch so far. It holds no second copy of a
  MEM-PS row: a row fetched for it leaves the MEM-PS until it is evicted back
  (``ParameterHierarchy.prepare``). It stays a table of its own because the train stage reads and
  writes rows through the HBM-PS table API, the same code path as on the GPU, and with
  ``--sparse-sync allreduce`` it also holds rows other ranks own, which the MEM-PS cannot;
- **batches in flight**: the parsed batches the pipeline's stages and queues hold, the readers'
  buffers, the rows fetched for batches prepared ahead and written back, one mini-batch's rows in
  the train step (``pipeline_bytes``);
- **SSD-PS buffers**: ``READ_THREADS`` read buffers and compaction's rows in flight, sized from the
  budget (``_ssd_buffers``);
- **MEM-PS tier**: the rest — the MEM-PS cache, which grows with the data up to what it can hold,
  and the SSD-PS key index, which grows with the table; the cache gives way to the index
  (``hps.mem.MemPS(budget_bytes=...)``).

A budget whose tier cannot cache one batch's working set on this rank is refused at start with
the sizes of the shares and the budget that would do. Device memory (``MemoryPlan.device``) is
planned apart: on ``cuda`` the HBM-PS cache of ``--hbm-budget`` (by default ``_hbm_budget.HBM_FREE_SHARE``
of the GPU's free memory at start; under the CUDA simulator, whose memory is unbounded, the CPU's
default).
What ``--hbm-budget`` allows, on both devices alike: ``_hbm_budget``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..data._parallel import WINDOW_PER_READER
from ..errors import InvalidInputError
from ..mem import MemPS, RowCache
from ..mem._unique import unique_bytes
from ..ssd._catalog import INDEX_START_KEYS
from .._index import KeyIndex
from .._options import DEFAULT_BUDGET_FRACTION, DEFAULT_ROWS_PER_FILE, format_bytes
from ._hbm_budget import (default_hbm_budget, device_free_bytes, hbm_bytes, hbm_row_bytes, hbm_rows_for,
                          table_keys, twin_growth_bytes, working_set_rows)
from ._machine import memory_available, memory_limit


#: Threads that may load from the SSD-PS at once, each with its own read buffer (prepare, compaction,
#: evaluation / export / checkpoint).
READ_THREADS = 3
#: SSD-PS buffers are this share of the budget (each of the READ_THREADS read buffers, and the
#: compaction batch), within the bounds below.
SSD_SHARE = 64
_MIN_BUF, _MAX_READ_BUF, _MAX_COMPACT = 16 << 10, 16 << 20, 64 << 20
#: KeyIndex bytes per slot (key u64, state i32, value 2 x i64) and slots per key (load <= 0.5, doubling).
INDEX_SLOT_BYTES, INDEX_SLOTS_PER_KEY = 28, (2, 4)
#: Parsed batches one rank's pipeline holds at once, besides ``QUEUED`` per item of --queue-depth:
#: the reader's current batch and its lookahead, and one in each of prepare, place and train;
#: each queue between two stages holds --queue-depth more.
HELD_BATCHES, QUEUES = 5, 3
#: A batch in flight holds about this many times its own bytes: the batch, its plan (unique keys and
#: their inverse per mini-batch and for the batch) and what its stages derive from it. Measured: a
#: plan of 2 left 3-100 MiB of the peak RSS of the report's jobs uncounted (3 at batches of 2,048
#: examples, 100 at 16,384 x 26 fields); 3 covers them.
PER_BATCH = 3
#: Bytes per example a batch surely takes whatever the data: one key (8) and a label (4).
MIN_EXAMPLE_BYTES = 12
#: A file reader's work unit in text chunks (``chunk_bytes``, 16 MiB by default, or its files when
#: smaller): the chunk and its parsed arrays (keys take more bytes than their text); besides its
#: units a reader holds one chunk of examples carried to the next batch. An estimate.
UNIT_CHUNKS = 2


@dataclass(frozen=True)
class Share:
    """``nbytes`` of the budget for ``what``."""

    what: str
    nbytes: int


@dataclass(frozen=True)
class MemoryPlan:
    budget: int                  # this rank's budget, bytes
    source: str                  # where it came from ("--mem-budget", or the share of the machine)
    shares: tuple                # Share, ...: the fixed parts of the budget, in the order printed
    tier_bytes: int              # the rest: MEM-PS cache + SSD-PS index (MemPS(budget_bytes=...))
    row_width: int               # float32 values per row
    rows_per_file: int
    read_buffer_bytes: int       # SSDOptions.read_buffer_bytes
    compact_batch_bytes: int     # SSDOptions.compact_batch_bytes
    hbm_keys: int                # HBM-PS capacity at first (keys)
    working_set: int             # rows this rank owns in the first batch (the tier must cache them)
    hbm_budget: int = 0          # --hbm-budget (or its default), bytes
    hbm_rows: int = 0            # rows the HBM-PS may hold (hbm_rows_for(hbm_budget))
    hbm_source: str = "--hbm-budget"  # where hbm_budget came from
    device: tuple = ()           # Share, ...: device memory (on cuda, the --hbm-budget cache)
    hbm_tracks: bool = False     # the default --hbm-budget rises with the working sets (cpu, simulator)
    twin_growth: int = 0         # DRAM the CPU twin adds to its share at --hbm-budget (TwinBudget)

    @property
    def row_bytes(self) -> int:
        return 4 * self.row_width

    @property
    def cache_rows(self) -> int:
        """The most rows the MEM-PS cache holds, while the SSD-PS index is still small."""
        return RowCache.rows_for_bytes(self.tier_bytes, self.row_width)

    def share(self, what: str) -> int:
        return sum(s.nbytes for s in self.shares if s.what == what)

    def ssd_options(self):
        """The SSD-PS buffer options this plan counted."""
        return dict(read_buffer_bytes=self.read_buffer_bytes,
                    max_read_bytes=min(1 << 20, self.read_buffer_bytes),
                    compact_batch_bytes=self.compact_batch_bytes)

    def index_bytes(self, keys: int) -> int:
        """The SSD-PS index of a table of ``keys`` at its largest (:func:`index_bytes_for`, with room
        for a MEM-PS chunk and a compaction batch more); 0 for none."""
        return self._index_bytes(keys, self.budget, self.tier_bytes)

    def _index_bytes(self, keys: int, budget: int, tier: int) -> int:
        """:meth:`index_bytes` under a plan of ``budget`` whose tier is ``tier`` bytes: the index
        as it grows to ``keys`` and as a table of ``keys`` takes one more MEM-PS chunk with a
        compaction's batch merging meanwhile. A write reserves index room for each of its rows,
        new or not (``KeyIndex.reserve``), and the MEM-PS keeps that room beside its cache
        (``MemPS._fit``): rows that cycle between the tiers and come back down to the SSD-PS ask it
        of a table that no longer grows. At least the index's first rebuild: the MEM-PS makes room
        for the next one from its start (``MemPS.__init__``), whatever the table."""
        return _index_need(keys, budget, tier, self.row_bytes, self.rows_per_file)

    @property
    def max_table_keys(self) -> int:
        """The most keys whose SSD-PS index (:meth:`index_bytes`) fits the tier beside a cache of
        one batch's working set and a chunk on its way: a larger table stops the job
        (``hps.mem.MemPS``)."""
        return self._max_table_keys(self.tier_bytes)

    def _max_table_keys(self, tier: int) -> int:
        """:attr:`max_table_keys` of a tier of ``tier`` bytes (e.g. once the twin has grown)."""
        room = tier * 15 // 16 - RowCache.bytes_for(max(1, self.working_set), self.row_width)
        lo, hi = 0, max(1, room // 56)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._index_bytes(mid, self.budget, tier) <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def budget_for_cache_rows(self, rows: int, table_keys: int = 0) -> int:
        """The smallest budget whose plan (these shares, the SSD-PS buffers and index of that
        budget) leaves a tier that caches ``rows`` rows of this size, and at least one batch's
        working set, beside the SSD-PS index of a table of ``table_keys`` (so that its
        ``max_table_keys`` >= ``table_keys``: a tier that caches fewer rows than the working set
        at the table's end would stop the job)."""
        fixed = sum(s.nbytes for s in self.shares if s.what != SSD_BUFFERS)
        cache = RowCache.bytes_for(max(1, rows, self.working_set), self.row_width)
        budget = fixed + cache
        while True:   # the SSD-PS buffers, the chunk and the compaction batch grow with the budget
            tier = budget - fixed - _ssd_buffers(budget, self.rows_per_file)[2]
            # the MEM-PS keeps 1/16 of it for rows on their way to the SSD-PS (hps.mem.MemPS)
            need = -(-(cache + self._index_bytes(table_keys, budget, tier)) * 16 // 15)
            if tier >= need:
                return budget
            budget += need - tier

    def describe(self) -> str:
        parts = ", ".join(f"{s.what} {format_bytes(s.nbytes)}" for s in self.shares)
        lo, hi = (INDEX_SLOT_BYTES * s for s in INDEX_SLOTS_PER_KEY)
        where = "in device memory" if self.device else "the twin, on the CPU"
        grows = "" if self.device or not self.twin_growth else (
            f" (its growth, up to {format_bytes(self.twin_growth)}, comes out of the MEM-PS tier: with the twin at "
            f"its budget, a table of up to {self._max_table_keys(self.tier_bytes - self.twin_growth):,} keys)")
        hbm = (f"; HBM-PS cache ({where}): --hbm-budget {format_bytes(self.hbm_budget)} ({self.hbm_source}), up to "
               f"{self.hbm_rows:,} rows, {self.hbm_keys:,} keys at first{grows}")
        return (f"budget {format_bytes(self.budget)} ({self.source}): {parts}; MEM-PS tier {format_bytes(self.tier_bytes)}: "
                f"a cache of up to {self.cache_rows:,} rows of {self.row_bytes} B with their maps and ghost "
                f"table, and the SSD-PS key index ({lo}-{hi} B per key of the table, about 200 B while it "
                f"doubles; the cache gives way to it: a table of up to {self.max_table_keys:,} keys){hbm}")


#: An SSD-PS key index (key -> (file, slot)) as an empty store opens it, for projections of its growth.
_EMPTY_INDEX = KeyIndex(width=2, capacity=INDEX_START_KEYS)
#: Names of the shares (``Share.what``).
MODEL, TWIN, IN_FLIGHT, SSD_BUFFERS = "model", "HBM-PS twin", "batches in flight", "SSD-PS buffers"
#: Name of the device share of the HBM-PS cache (``MemoryPlan.device`` on ``cuda``).
HBM_CACHE = "HBM-PS cache"


def index_bytes_for(keys: int, row_bytes: int) -> int:
    """The most DRAM the SSD-PS key index and block crcs hold while an index asked for room for
    ``keys`` keys (:meth:`KeyIndex.reserve`) grows to them from an empty store's, whatever the
    sizes of the writes: its rebuilds one key at a time (each doubles; a write larger than the
    capacity skips rebuilds, and its single one peaks lower), as ``KeyIndex.peak_bytes`` counts them;
    4 B of crc per 4 KiB of rows."""
    if keys <= 0:
        return 0
    return _EMPTY_INDEX.peak_bytes(int(keys)) + 4 * -(-int(keys) * int(row_bytes) // 4096)


def _index_need(keys: int, budget: int, tier: int, row_bytes: int, rows_per_file: int) -> int:
    """``MemoryPlan._index_bytes`` of a plan of ``budget`` whose tier is ``tier`` bytes."""
    if keys <= 0:
        return 0
    chunk = MemPS.chunk_rows(tier, row_bytes)
    merge = compaction_rows(budget, row_bytes, rows_per_file)
    return index_bytes_for(max(keys + chunk + merge, _EMPTY_INDEX.capacity + 1), row_bytes)


def tier_floor(rows: int, budget: int, row_width: int, rows_per_file: int) -> int:
    """The least of a budget's MEM-PS tier that caches ``rows`` rows (one batch's owned working set)
    beside the SSD-PS index of their table, with the 1/16 the MEM-PS keeps for rows on their way to
    the SSD-PS (``hps.mem.MemPS``); its chunk counted at the whole budget's (an upper bound)."""
    rows = max(1, int(rows))
    need = RowCache.bytes_for(rows, row_width) + _index_need(rows, budget, budget, 4 * int(row_width), rows_per_file)
    return -(-need * 16 // 15)


def compaction_rows(budget: int, row_bytes: int, rows_per_file: int) -> int:
    """Rows one SSD-PS compaction step merges (``Compactor.rows_cap`` with the plan's batch)."""
    return max(1, min(int(rows_per_file), _ssd_buffers(budget, rows_per_file)[1] // (int(row_bytes) + 16)))


def resolve_budget(explicit: int | None, ranks_on_node: int) -> tuple[int, str]:
    """-> (this rank's budget, where it came from). ``explicit`` (``--mem-budget``) is used as given,
    but refused when this node's ranks would together ask for more than the machine has (a typo
    such as 2TB for 2GB fails here, before anything is allocated). Without it: a
    ``DEFAULT_BUDGET_FRACTION`` of the memory available, over the ranks on the node."""
    r = max(1, int(ranks_on_node))
    if explicit is not None:
        limit, what = memory_limit()
        if limit is not None and int(explicit) * r > limit:
            each = f" x {r} ranks on this node" if r > 1 else ""
            raise InvalidInputError(
                f"--mem-budget {format_bytes(explicit)}{each} is more than this machine's memory, {format_bytes(limit)} "
                f"({what}): lower it, or leave it out to use {DEFAULT_BUDGET_FRACTION} of the memory available")
        return int(explicit), "--mem-budget"
    avail, what = memory_available()
    if avail is None:
        raise InvalidInputError(f"cannot size the memory budget: {what}; give --mem-budget")
    return (int(DEFAULT_BUDGET_FRACTION * avail / r),
            f"{DEFAULT_BUDGET_FRACTION} x {what} {format_bytes(avail)} / {r} rank{'s' if r > 1 else ''} on this node")


def batches_held(queue_depth: int) -> int:
    """Parsed batches one rank's pipeline holds at once (``HELD_BATCHES`` + ``QUEUES`` x depth)."""
    return HELD_BATCHES + QUEUES * int(queue_depth)


def check_batch_size(batch_size: int, minibatch_size: int, n_ranks: int, queue_depth: int, budget: int,
                     source: str) -> None:
    """Refuse, before any batch is read, a ``--batch-size`` whose batches in flight cannot fit the
    budget whatever the data: ``MIN_EXAMPLE_BYTES`` per example, 8 B per mini-batch of the plan."""
    share = -(-int(batch_size) // max(1, int(n_ranks)))
    held = batches_held(queue_depth)
    need = held * (MIN_EXAMPLE_BYTES * share + 8 * -(-int(batch_size) // int(minibatch_size)))
    if need > budget:
        raise InvalidInputError(
            f"--batch-size {int(batch_size):,}: the {held} batches a rank's pipeline holds take at least "
            f"{format_bytes(need)} ({MIN_EXAMPLE_BYTES} B per example: a key and a label; each field and dense "
            f"feature adds more), more than the memory budget of {format_bytes(budget)} ({source}): lower --batch-size")


def pipeline_bytes(batch_bytes: int, queue_depth: int, reader_bytes: int, owned_working_set: int, row_bytes: int,
                   window: int, minibatch_keys: int, batch_keys: int = 0) -> int:
    """Bytes of the batches in flight: the parsed batches held, each with its plan and the arrays its
    stages derive from it (``PER_BATCH`` x its own bytes), the hash table and outputs of one
    ``unique_counts`` over a batch's ``batch_keys`` key occurrences (``hps.mem._unique.unique_bytes``:
    the largest dedup of a batch, e.g. admission's; the plans' ``unique_segments`` holds less), the readers' buffers
    (``reader_bytes``), the rows fetched for ``window`` batches prepared ahead and one batch's rows
    written back, and one mini-batch's rows, gradients and updated rows in the train step."""
    n = int(batch_keys)
    unique = unique_bytes(n) if n else 0
    return (PER_BATCH * batches_held(queue_depth) * int(batch_bytes) + unique + int(reader_bytes)
            + (window + 1) * int(owned_working_set) * row_bytes + 3 * int(minibatch_keys) * row_bytes)


def units_in_flight(threads: int) -> int:
    """Work units a dataset read by ``threads`` reader threads holds at once (``hps.data._parallel``:
    one, made in the consumer's thread, with one reader; else ``WINDOW_PER_READER`` per thread
    and the one the consumer holds)."""
    return 1 if int(threads) <= 1 else int(threads) * WINDOW_PER_READER + 1


def reader_bytes(readers, threads: int = 1, batch_bytes: int = 0) -> int:
    """The buffers of this rank's readers (``Feed.readers``, each read by ``threads`` threads): a
    file reader holds ``units_in_flight`` units of ``UNIT_CHUNKS`` text chunks each (no more than
    the bytes its shard reads: a compressed file counts whole chunks) and a chunk of carried
    examples; a synthetic one holds its units' blocks of examples (``batch_bytes`` per local
    batch; the block its consumer holds is a batch in flight, counted there)."""
    units, total = units_in_flight(threads), 0
    for r in readers:
        r = getattr(r, "_d", r)   # an --op-osrp HashedReader's dataset
        chunk = getattr(r, "chunk_bytes", 0)
        if chunk and hasattr(r, "segments"):
            spans = sum(seg.stop - seg.start if seg.stop is not None else chunk for seg in r.segments())
            total += UNIT_CHUNKS * min(units * chunk, spans) + min(chunk, spans)
        elif getattr(r, "block_rows", 0) and getattr(r, "batch_size", 0):
            total += (units - 1) * -(-int(batch_bytes) * int(r.block_rows) // int(r.batch_size))
    return total


def _ssd_buffers(budget: int, rows_per_file: int):
    """-> (read_buffer_bytes, compact_batch_bytes, SSD-PS buffer bytes in all) for ``budget``."""
    share = budget // SSD_SHARE
    read_buf = max(_MIN_BUF, min(_MAX_READ_BUF, share // 4096 * 4096))
    compact = max(_MIN_BUF, min(_MAX_COMPACT, share))
    return read_buf, compact, READ_THREADS * read_buf + 2 * compact + 16 * rows_per_file


def budget_for_rows(rows: int, row_width: int, rows_per_file: int = DEFAULT_ROWS_PER_FILE, dtype=np.float32) -> int:
    """The smallest MEM-PS tier (to the byte, up to the SSD-PS buffers' steps) that caches ``rows``
    rows while the SSD-PS index is small, with the SSD-PS buffers a budget of that size takes."""
    cache = RowCache.bytes_for(max(1, rows), row_width, dtype)
    budget = cache
    while RowCache.rows_for_bytes(budget - _ssd_buffers(budget, rows_per_file)[2], row_width, dtype) < rows:
        budget = cache + _ssd_buffers(budget, rows_per_file)[2]   # the buffers grow with the budget
    return budget


def plan_memory(budget: int, row_width: int, owned_working_set: int, working_set: int, *, window: int,
                device: str, n_parts: int = 1, hbm_capacity: int | None = None, rows_per_file: int = DEFAULT_ROWS_PER_FILE,
                source: str = "--mem-budget", model: dict | None = None, pipeline: int = 0,
                hbm_budget: int | None = None, free_bytes=None) -> MemoryPlan:
    """Split ``budget`` bytes (one rank; float32 rows of ``row_width``) -> MemoryPlan. ``model``: {what: bytes} of the model
    (``_preflight.memory_floor``); ``pipeline``: bytes of the batches in flight (``pipeline_bytes``);
    ``hbm_budget``: ``--hbm-budget`` (None: :func:`default_hbm_budget`, ``free_bytes`` the GPU's free
    memory on ``cuda``). Raises InvalidInputError, naming every share, when the tier left cannot cache
    ``owned_working_set`` rows (one batch's keys this rank owns), or when ``hbm_budget`` holds no row."""
    itemsize = 4
    row_bytes = row_width * itemsize
    read_buf, compact, ssd = _ssd_buffers(budget, rows_per_file)
    planned = working_set_rows(working_set, window)
    hbm_source, tracks = "--hbm-budget", False
    if hbm_budget is None:   # on cpu the twin's share of what the tier can spare beyond its floor
        fixed = sum((model or {}).values()) + int(pipeline) + ssd
        room = budget - fixed - tier_floor(owned_working_set, budget, row_width, rows_per_file)
        hbm_budget, hbm_source, tracks = default_hbm_budget(device, row_width, itemsize, planned, free_bytes,
                                                            room, n_parts)
    hbm_rows = hbm_rows_for(hbm_budget, row_width, itemsize)
    if hbm_rows < 1:
        raise InvalidInputError(f"--hbm-budget {hbm_budget} B holds no row of {hbm_row_bytes(row_width, itemsize)} B: "
                                "raise it")
    # the slot array a table of that many keys takes holds up to its load factor: ask for all of it
    first = hbm_capacity or planned
    hbm_keys = min(table_keys(first), hbm_rows)
    shares = [Share(MODEL, sum((model or {}).values()))]
    if device == "cpu":
        shares.append(Share(TWIN, hbm_bytes(hbm_keys, row_width, itemsize, n_parts)))
    shares += [Share(IN_FLIGHT, int(pipeline)), Share(SSD_BUFFERS, ssd)]
    tier = budget - sum(s.nbytes for s in shares)
    plan = MemoryPlan(budget, source, tuple(shares), max(0, tier), row_width, rows_per_file, read_buf, compact,
                      hbm_keys, owned_working_set, int(hbm_budget), hbm_rows, hbm_source,
                      (Share(HBM_CACHE, int(hbm_budget)),) if device == "cuda" else (), tracks,
                      max(0, hbm_bytes(hbm_rows, row_width, itemsize, n_parts) - shares[1].nbytes) if device == "cpu" else 0)
    need_rows = max(1, owned_working_set)
    # the MEM-PS caches a batch's rows beside the SSD-PS index of a table that holds them (MemPS keeps
    # room for the index's first rebuild from its start): a plan short of that stops at the first batch
    if tier < RowCache.bytes_for(need_rows, row_width) or plan.max_table_keys < need_rows:
        need = plan.budget_for_cache_rows(need_rows, need_rows)
        parts = ", ".join(f"{s.what} {format_bytes(s.nbytes)}" for s in shares)
        raise InvalidInputError(
            f"a memory budget of {format_bytes(budget)} ({source}) cannot hold one batch's working set: {parts} "
            f"leave {format_bytes(max(0, tier))} for the MEM-PS, which must cache the {owned_working_set:,} rows of "
            f"{row_bytes} B this rank owns in a batch ({format_bytes(RowCache.bytes_for(need_rows, row_width))} "
            f"with their maps and ghost table) beside the SSD-PS key index of their table "
            f"({format_bytes(plan.index_bytes(need_rows))}); raise --mem-budget to at least {need} B "
            f"({format_bytes(need)}) or lower --batch-size")
    return plan


def plan_job(trainer, resident: int, owned: int, model: dict, window: int) -> MemoryPlan:
    """The plan of ``trainer``'s job: its budget (``trainer.budget``: (bytes, source)), config, row
    width and first local batch (``trainer.first_batch``, which sizes the batches in flight);
    ``resident``/``owned``: the first batch's working set on this rank and the rows of it it owns;
    ``model``: ``_preflight.memory_floor``."""
    cfg, t = trainer.cfg, trainer.cfg.tiers
    first = trainer.first_batch
    batch = 0 if first is None else sum(getattr(first, f).nbytes for f in BATCH_ARRAYS)
    share = -(-cfg.train.minibatch_size // trainer.coll.size)
    pipe = pipeline_bytes(batch, cfg.train.queue_depth, reader_bytes(trainer.feed.readers, trainer.feed.reader_threads, batch), owned,
                          4 * trainer.row_width, window, share * trainer.feed.n_fields,
                          0 if first is None else first.keys.shape[0])
    budget, source = trainer.budget
    return plan_memory(budget, trainer.row_width, owned, resident, window=window, device=t.device,
                       n_parts=t.n_parts, hbm_capacity=t.hbm_capacity, rows_per_file=t.rows_per_file,
                       source=source, model=model, pipeline=pipe, hbm_budget=t.hbm_budget,
                       free_bytes=device_free_bytes(t.device))


class TwinBudget:
    """Charges the growth of the CPU HBM-PS twin beyond the plan to the MEM-PS tier (the twin is
    sized from the first batch; rows staying resident grow it up to ``--hbm-budget``:
    ``ParameterHierarchy.prepare``).
    Called as ``grow(capacity, reserve)``: lowers the MEM-PS budget (``hps.mem.MemPS.set_budget``:
    the cache sheds rows) by what the twin holds beyond its share while it rebuilds (old and new
    tables and the rows moved between them), reserves, then by what the grown twin holds."""

    def __init__(self, plan: MemoryPlan, memps, n_parts: int):
        self.plan, self.memps, self.n_parts = plan, memps, int(n_parts)
        self.capacity = plan.hbm_keys

    def _table(self, capacity: int) -> int:
        """The twin's table(s) at ``capacity`` keys."""
        return hbm_bytes(capacity, self.plan.row_width, 4, self.n_parts)

    def __call__(self, capacity: int, reserve) -> None:
        planned, new = self._table(self.plan.hbm_keys), self._table(capacity)
        moving = twin_growth_bytes(self.capacity, capacity, self.plan.row_width, 4, self.n_parts)
        self.memps.set_budget(self.plan.tier_bytes - max(0, moving - planned))
        reserve(capacity)
        self.capacity = capacity
        self.memps.set_budget(self.plan.tier_bytes - max(0, new - planned))


#: The arrays of a ``hps.data.Batch``.
BATCH_ARRAYS = ("labels", "dense", "keys", "field", "weights", "offsets")
