"""``plan_memory``: how one rank's ``--mem-budget`` is spent, decided before training starts.

Inside the budget (the DRAM structures that grow with the working set or the traffic):

- the MEM-PS cache: its rows **and** its per-row state, key map and ghost frequency table
  (``RowCache.bytes_for``: 134-222 B of bookkeeping per cached row at the default ghost factor 4);
- the SSD-PS I/O buffers: ``READ_THREADS`` read buffers of ``read_buffer_bytes`` and compaction's
  rows in flight (2 x ``compact_batch_bytes``, plus the keys section of one victim file), both sized
  here from the budget.

Printed beside it (they do not depend on the budget):

- the HBM-PS twin on ``--device cpu`` (a CPU hash table holding the working sets of
  ``window + 1`` batches, sized from the first batch); on ``cuda`` it lives in GPU memory. It holds
  no second copy of a MEM-PS row: a row fetched for it leaves the MEM-PS until it is evicted back
  (``ParameterHierarchy.prepare``). It stays a table of its own because the train stage reads and
  writes rows through the HBM-PS table API, the same code path as on the GPU, and with
  ``--sparse-sync allreduce`` it also holds rows other ranks own, which the MEM-PS (this rank's
  keys only) cannot hold;
- the SSD-PS key index, per key of the table (``KeyIndex`` of (file, slot): 8 B key + 4 B state +
  16 B value per slot, 2 to 4 slots per key; for a moment while it doubles, the old and the new
  arrays and the entries copied between them, ``INDEX_GROWING_BYTES``) and the block crcs (4 B per
  block of rows);
- the pipeline's batches in flight: the rows prepare has fetched for up to ``window`` batches
  ahead of training (``window`` x the first batch's working set, the best estimate before
  training; a later, larger working set takes more).

A budget whose cache cannot hold one batch's working set on this rank is an InvalidInputError.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError
from ..mem import RowCache
from ..table import DEFAULT_MAX_LOAD_FACTOR, SLOT_OVERHEAD_BYTES, slots_for

#: Threads that may load from the SSD-PS at once, each with its own read buffer (prepare, compaction,
#: evaluation / export / checkpoint).
READ_THREADS = 3
#: SSD-PS buffers are this share of the budget (each of the READ_THREADS read buffers, and the
#: compaction batch), within the bounds below.
SSD_SHARE = 64
_MIN_BUF, _MAX_READ_BUF, _MAX_COMPACT = 16 << 10, 16 << 20, 64 << 20
#: KeyIndex bytes per slot (key u64, state i32, value 2 x i64) and slots per key (load <= 0.5, doubling).
INDEX_SLOT_BYTES, INDEX_SLOTS_PER_KEY = 28, (2, 4)
#: KeyIndex bytes per key for a moment while it doubles: the old slots (2 per key), the new ones (4)
#: and the entries copied between them (key + value, 24 B).
INDEX_GROWING_BYTES = 6 * INDEX_SLOT_BYTES + 24


@dataclass(frozen=True)
class MemoryPlan:
    budget: int                 # --mem-budget of this rank, bytes
    cache_rows: int             # MEM-PS capacity
    cache_bytes: int            # its DRAM: rows, state, key map, ghost table
    row_bytes: int
    read_buffer_bytes: int      # SSDOptions.read_buffer_bytes
    compact_batch_bytes: int    # SSDOptions.compact_batch_bytes
    ssd_buffer_bytes: int       # READ_THREADS read buffers + compaction in flight
    hbm_keys: int               # HBM-PS capacity (keys)
    hbm_dram_bytes: int         # the HBM-PS twin's DRAM (0 on cuda)
    working_set: int            # rows this rank pins for the first batch
    pipeline_bytes: int = 0     # rows fetched for the batches in flight (window x working set)

    def ssd_options(self):
        """The SSD-PS buffer options this plan counted."""
        return dict(read_buffer_bytes=self.read_buffer_bytes,
                    max_read_bytes=min(1 << 20, self.read_buffer_bytes),
                    compact_batch_bytes=self.compact_batch_bytes)

    def describe(self) -> str:
        lo, hi = (INDEX_SLOT_BYTES * s for s in INDEX_SLOTS_PER_KEY)
        twin = (f"HBM-PS twin {_size(self.hbm_dram_bytes)} ({self.hbm_keys:,} keys on the CPU)"
                if self.hbm_dram_bytes else "HBM-PS in GPU memory")
        grow = INDEX_GROWING_BYTES
        return (f"budget {_size(self.budget)}: MEM-PS cache {_size(self.cache_bytes)} "
                f"({self.cache_rows:,} rows of {self.row_bytes} B with their maps and ghost table), "
                f"SSD-PS buffers {_size(self.ssd_buffer_bytes)}; beside it: {twin}, batches in flight "
                f"{_size(self.pipeline_bytes)}, SSD-PS index {lo}-{hi} B per key of the table ({grow} B "
                f"while it doubles; about {_size(16e6 * (lo + hi) / 2)} for 16 M keys) + 4 B per 4 KiB of rows")


def _size(n: float) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.1f} {unit}"
    return f"{int(n)} B"


def hbm_bytes(capacity: int, row_width: int, itemsize: int, n_parts: int, window: int, working_set: int) -> int:
    """DRAM of a CPU HBM-PS twin: its table(s) (key u64, state i32, cache score u64, row per slot) and the residency
    bookkeeping (a KeyIndex of the resident keys, the working sets of ``window + 1`` batches)."""
    if n_parts > 1:
        part = min(capacity, -(-5 * capacity // (4 * n_parts)) + 64)
        slots = n_parts * slots_for(part, DEFAULT_MAX_LOAD_FACTOR)
    else:
        slots = slots_for(capacity, DEFAULT_MAX_LOAD_FACTOR)
    resident = (window + 1) * working_set
    return (slots * (SLOT_OVERHEAD_BYTES["cpu"] + row_width * itemsize)
            + slots_for(2 * resident, DEFAULT_MAX_LOAD_FACTOR) * 20
            + 8 * resident)


def _ssd_buffers(budget: int, rows_per_file: int):
    """-> (read_buffer_bytes, compact_batch_bytes, SSD-PS buffer bytes in all) for ``budget``."""
    share = budget // SSD_SHARE
    read_buf = max(_MIN_BUF, min(_MAX_READ_BUF, share // 4096 * 4096))
    compact = max(_MIN_BUF, min(_MAX_COMPACT, share))
    return read_buf, compact, READ_THREADS * read_buf + 2 * compact + 16 * rows_per_file


def budget_for_rows(rows: int, row_width: int, rows_per_file: int = 16_384, dtype=np.float32) -> int:
    """The smallest budget (to the byte, up to the SSD-PS buffers' steps) whose plan caches at least
    ``rows`` rows: their cache bytes plus the SSD-PS buffers a budget of that size takes."""
    cache = RowCache.bytes_for(max(1, rows), row_width, dtype)
    budget = cache
    while RowCache.rows_for_bytes(budget - _ssd_buffers(budget, rows_per_file)[2], row_width, dtype) < rows:
        budget = cache + _ssd_buffers(budget, rows_per_file)[2]   # the buffers grow with the budget
    return budget


def plan_memory(budget: int, row_width: int, owned_working_set: int, working_set: int, *, window: int,
                device: str, n_parts: int = 1, hbm_capacity: int | None = None,
                rows_per_file: int = 16_384, dtype=np.float32) -> MemoryPlan:
    """Split ``budget`` bytes (one rank) -> MemoryPlan; InvalidInputError when the cache left cannot
    hold ``owned_working_set`` rows (one batch's keys this rank owns)."""
    itemsize = np.dtype(dtype).itemsize
    row_bytes = row_width * itemsize
    read_buf, compact, ssd = _ssd_buffers(budget, rows_per_file)
    rows = RowCache.rows_for_bytes(budget - ssd, row_width, dtype) if budget > ssd else 0
    hbm_keys = hbm_capacity or max(1024, 2 * (window + 1) * working_set)
    twin = hbm_bytes(hbm_keys, row_width, itemsize, n_parts, window, working_set) if device == "cpu" else 0
    if rows < max(1, owned_working_set):
        need = budget_for_rows(owned_working_set, row_width, rows_per_file, dtype)
        raise InvalidInputError(
            f"--mem-budget {budget} B cannot hold one batch's working set: {owned_working_set:,} rows of "
            f"{row_bytes} B on this rank need a MEM-PS cache of "
            f"{_size(RowCache.bytes_for(max(1, owned_working_set), row_width, dtype))} (rows with their maps "
            f"and ghost table) beside the SSD-PS buffers; raise --mem-budget to at least {need} B "
            f"({_size(need)}) or lower --batch-size")
    return MemoryPlan(budget, rows, RowCache.bytes_for(rows, row_width, dtype), row_bytes, read_buf, compact,
                      ssd, hbm_keys, twin, owned_working_set, window * owned_working_set * row_bytes)
