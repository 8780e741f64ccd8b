"""``MemConfig``: the MEM-PS settings of :meth:`hps.mem.MemPS.from_config`, validated on construction.

The training job does not use it: there ``--mem-budget`` (``hps.config.TierConfig.mem_budget``) sets
the budget, ``hps.config.ModelOptions`` the initializer, and the LRU share and ghost factor keep their
defaults (``DEFAULT_LRU_FRACTION``, ``DEFAULT_GHOST_FACTOR``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidInputError
from ._cache import DEFAULT_GHOST_FACTOR, DEFAULT_LRU_FRACTION


@dataclass(frozen=True)
class MemConfig:
    budget_bytes: int = 1 << 30                        #: DRAM of one node's MEM-PS: cache + store index (1 GiB)
    lru_fraction: float = DEFAULT_LRU_FRACTION         #: share of the budget for the LRU part
    ghost_factor: float = DEFAULT_GHOST_FACTOR         #: ghost frequency table, x capacity rows
    init_scale: float = 0.01                           #: new embeddings uniform in [-scale, scale)
    init_state: float = 0.0                            #: initial optimizer-state columns
    seed: int = 0                                      #: initializer seed (same on every rank)

    def __post_init__(self):
        if self.budget_bytes < 1:
            raise InvalidInputError(f"budget_bytes must be >= 1, got {self.budget_bytes}")
        if not 0.0 <= self.lru_fraction <= 1.0:
            raise InvalidInputError(f"lru_fraction must be in [0, 1], got {self.lru_fraction}")
        if self.ghost_factor < 0:
            raise InvalidInputError(f"ghost_factor must be >= 0, got {self.ghost_factor}")
        if not self.init_scale > 0:
            raise InvalidInputError(f"init_scale must be > 0, got {self.init_scale}")
