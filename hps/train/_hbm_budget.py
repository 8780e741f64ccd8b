"""What ``--hbm-budget`` allows: the rows an HBM-PS cache of so many bytes holds, its default, and the
DRAM of the CPU twin (``--device cpu``). ``_budget.plan_memory`` puts the figures in the job's plan.

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


def default_hbm_budget(device: str, row_width: int, itemsize: int, keys: int, free_bytes=None) -> tuple[int, str]:
    """(bytes, where they came from) of ``--hbm-budget`` when it is not given: on ``cuda``
    :data:`HBM_FREE_SHARE` of ``free_bytes`` (the GPU's free memory at start); on ``cpu`` (and on the
    CUDA simulator, whose free memory is unbounded) the bytes of a table of ``keys`` rows."""
    if device == "cuda" and free_bytes is not None and np.isfinite(free_bytes):
        return int(HBM_FREE_SHARE * free_bytes), f"default: {HBM_FREE_SHARE:g} of the GPU's free {format_bytes(free_bytes)}"
    return hbm_budget_for(keys, row_width, itemsize), "default: 2 x (window + 1) first working sets"


def hbm_budget_for(rows: int, row_width: int, itemsize: int = 4) -> int:
    """The smallest ``--hbm-budget`` whose HBM-PS holds ``rows`` rows (:func:`hbm_rows_for`)."""
    return slots_for(rows, DEFAULT_MAX_LOAD_FACTOR) * _slot_bytes(row_width, itemsize)


def device_free_bytes(device: str):
    """The free memory of the current GPU (``cuda``; inf under the CUDA simulator), else None."""
    if device != "cuda":
        return None
    from numba import cuda

    return float(cuda.current_context().get_memory_info()[0])
