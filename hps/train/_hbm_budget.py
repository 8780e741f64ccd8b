"""What ``--hbm-budget`` allows: the rows an HBM-PS cache of so many bytes holds, its default, and the
DRAM of the CPU twin (``--device cpu``). ``_budget.plan_memory`` puts the figures in the job's plan.

Its default: on ``cuda``, :data:`HBM_FREE_SHARE` of the GPU's free memory at start; on ``cpu`` (and on
the CUDA simulator, whose free memory is unbounded, so that the two stay equal) the twin's share of the
host budget, :func:`twin_share_budget`: the largest twin whose last growth (old and new tables and the
rows moved between them, ``_budget.TwinBudget``) takes no more than :data:`TWIN_SHARE` of the room the
MEM-PS tier has beyond caching one batch's owned working set and the SSD-PS index of its table, and
never less than ``2 x (window + 1)`` working sets of the largest batch so far
(:func:`working_set_budget_rows`).

``--hbm-budget`` counts every resident row at :func:`hbm_row_bytes` (its row, the CUDA slot's
overhead, at the default load factor), the same on both devices, so a CPU and a CUDA job with the
same budget hold the same rows and evict the same ones; the slot count is a power of two, so the rows
it allows (:func:`hbm_rows_for`) are those of the largest slot array that fits the budget.
"""

from __future__ import annotations

import numpy as np

from .._options import format_bytes
from ..table import DEFAULT_MAX_LOAD_FACTOR, SLOT_OVERHEAD_BYTES, slots_for

#: ``--device cuda`` without ``--hbm-budget``: this share of the GPU's free memory at start.
HBM_FREE_SHARE = 0.5


def hbm_bytes(capacity: int, row_width: int, itemsize: int, n_parts: int) -> int:
    """DRAM of a CPU HBM-PS twin of ``capacity`` keys: its table(s) (key u64, state i32, cache score
    u64, row per slot). Residency lives in the table itself (``_hierarchy``): no bookkeeping beside it."""
    if n_parts > 1:
        part = min(capacity, -(-5 * capacity // (4 * n_parts)) + 64)
        slots = n_parts * slots_for(part, DEFAULT_MAX_LOAD_FACTOR)
    else:
        slots = slots_for(capacity, DEFAULT_MAX_LOAD_FACTOR)
    return slots * (SLOT_OVERHEAD_BYTES["cpu"] + row_width * itemsize)


def _slot_bytes(row_width: int, itemsize: int) -> int:
    """A CUDA slot of the HBM-PS: its overhead and its row (the unit ``--hbm-budget`` counts on both
    devices; the CPU twin's slot is smaller)."""
    return SLOT_OVERHEAD_BYTES["cuda"] + row_width * itemsize


def hbm_row_bytes(row_width: int, itemsize: int) -> int:
    """Bytes ``--hbm-budget`` counts per resident row: a CUDA slot at the default load factor (the same
    figure on both devices keeps them equal)."""
    return int(np.ceil(_slot_bytes(row_width, itemsize) / DEFAULT_MAX_LOAD_FACTOR))


def hbm_rows_for(budget: int, row_width: int, itemsize: int) -> int:
    """Rows an HBM-PS of ``budget`` bytes may hold: those of the largest power-of-two slot array whose
    slots fit the budget, at the default load factor (0 when not even two slots fit)."""
    slots = int(budget) // _slot_bytes(row_width, itemsize)
    return 0 if slots < 2 else int((1 << (slots.bit_length() - 1)) * DEFAULT_MAX_LOAD_FACTOR)


def default_hbm_budget(device: str, row_width: int, itemsize: int, keys: int, free_bytes=None,
                       room: int = 0, n_parts: int = 1) -> tuple[int, str, bool]:
    """(bytes, where they came from, whether it tracks the working sets) of ``--hbm-budget`` when it is
    not given: on ``cuda`` :data:`HBM_FREE_SHARE` of ``free_bytes`` (the GPU's free memory at start);
    on ``cpu`` (and on the CUDA simulator, whose free memory is unbounded) the twin's share of
    ``room``, the host bytes the MEM-PS tier can spare (:func:`twin_share_budget`), but at least a
    table of ``keys`` rows (the working sets of the first batch, :func:`working_set_rows`): that floor
    keeps tracking the working sets (it rises with a larger batch, ``ParameterHierarchy.prepare``)."""
    if device == "cuda" and free_bytes is not None and np.isfinite(free_bytes):
        return int(HBM_FREE_SHARE * free_bytes), f"default: {HBM_FREE_SHARE:g} of the GPU's free {format_bytes(free_bytes)}", False
    share, floor = twin_share_budget(room, row_width, itemsize, n_parts), hbm_budget_for(keys, row_width, itemsize)
    spare = f"{TWIN_SHARE:g} of the {format_bytes(max(0, room))} the MEM-PS tier can spare"
    if share > floor:
        return share, f"default: the twin's share, {spare}; at least {_WORKING_SETS}", True
    return floor, f"default: {_WORKING_SETS} (more than the twin's share, {spare})", True


#: ``--device cpu`` without ``--hbm-budget``: the twin's last growth may take this share of the room
#: the MEM-PS tier has beyond one batch's working set and the SSD-PS index (``_budget.plan_memory``).
#: The rest stays the MEM-PS's: it caches the rows the twin evicts and holds the index of a table
#: larger than DRAM, whose rows cost an SSD-PS read where an eviction to the MEM-PS costs a copy
#: (a row in the twin takes 2-4 slots of 20 B and its row; in the MEM-PS about 1.6-2 x its row).
#: Half: on issue #25's file it holds the whole table (4 ranks: 0 evictions instead of 3.0 M, 7-8 % less
#: CPU; docs/training.md) while a table past DRAM keeps most of the tier for its index.
TWIN_SHARE = 0.5
#: The floor of the default ``--hbm-budget`` of the CPU twin (and of the CUDA simulator), as the plan
#: names it: :func:`working_set_rows` of the largest batch so far, so it rises when a later batch
#: touches more keys than the first (``ParameterHierarchy.prepare``).
_WORKING_SETS = "2 x (window + 1) working sets of the largest batch so far"


def twin_growth_bytes(old: int, new: int, row_width: int, itemsize: int, n_parts: int) -> int:
    """DRAM the CPU twin holds while it grows from ``old`` to ``new`` keys: both tables and the live rows
    (key and row) copied between them (``_budget.TwinBudget`` charges it to the MEM-PS tier)."""
    return (hbm_bytes(new, row_width, itemsize, n_parts) + (hbm_bytes(old, row_width, itemsize, n_parts) if old else 0)
            + int(old) * (8 + int(row_width) * int(itemsize)))


def twin_share_budget(room: int, row_width: int, itemsize: int, n_parts: int = 1) -> int:
    """The largest ``--hbm-budget`` (0: none) whose CPU twin, grown to it by doubling, held no more than
    :data:`TWIN_SHARE` of ``room`` bytes at its last growth (:func:`twin_growth_bytes` from half its
    rows): the twin's share of the host budget."""
    cap, rows = int(TWIN_SHARE * max(0, int(room))), 0
    while True:   # O(log rows): the slot arrays are powers of two
        nxt = table_keys(max(1024, 2 * rows))
        if twin_growth_bytes(nxt // 2, nxt, row_width, itemsize, n_parts) > cap:
            return hbm_budget_for(rows, row_width, itemsize) if rows else 0
        rows = nxt


def working_set_rows(working_set: int, window: int) -> int:
    """Keys the default budget plans for a batch of ``working_set`` keys on this rank: ``2 x (window + 1)``
    of them (the batches in flight and as many again of recent rows), at least 1,024."""
    return max(1024, 2 * (int(window) + 1) * int(working_set))


def working_set_budget_rows(working_set: int, window: int) -> int:
    """Rows the default budget allows for a batch of ``working_set`` keys (:func:`working_set_rows`): all
    that the slot array of a table of that many keys holds, whatever the row width."""
    return table_keys(working_set_rows(working_set, window))


def table_keys(keys: int) -> int:
    """The keys the slot array of a table asked for ``keys`` keys holds at the default load factor (at
    least ``keys``: the slot count is a power of two). A table grown or planned to this many keys uses
    all of the slots it takes; one asked for ``keys`` would take the same slots and grow again sooner."""
    return int(slots_for(int(keys), DEFAULT_MAX_LOAD_FACTOR) * DEFAULT_MAX_LOAD_FACTOR)


def hbm_budget_for(rows: int, row_width: int, itemsize: int = 4) -> int:
    """The smallest ``--hbm-budget`` whose HBM-PS holds ``rows`` rows (:func:`hbm_rows_for`)."""
    return slots_for(rows, DEFAULT_MAX_LOAD_FACTOR) * _slot_bytes(row_width, itemsize)


def device_free_bytes(device: str):
    """The free memory of the current GPU (``cuda``; inf under the CUDA simulator), else None."""
    if device != "cuda":
        return None
    from numba import cuda

    return float(cuda.current_context().get_memory_info()[0])
