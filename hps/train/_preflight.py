"""Checks a job makes before it trains, so one that cannot finish fails in its first seconds.

- ``check_outputs``: ``--plots`` has matplotlib; every output path (``--metrics-out``, ``--plots``,
  ``--export``, ``--checkpoint-dir``) can be written.
- ``check_memory``: what the model and the HBM-PS table will surely allocate on the host fits in
  this machine's memory.

Each raises ``InvalidInputError`` with one line naming the flag to change. (The data is checked by
the readers' ``probe()``.)
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InvalidInputError
from ..table import DEFAULT_MAX_LOAD_FACTOR, slots_for

#: cgroup v2 memory limit of this process's container, when there is one.
_CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")
#: Dense optimizer -> float32 state tensors per parameter.
_DENSE_SLOTS = {"adam": 2, "sgd": 0}


def check_outputs(tc) -> None:
    """tc: ``TrainConfig``. Raises when an output of the job could not be written after training."""
    if tc.plots:
        from ._plots import require

        require()
    if tc.metrics_out:
        _check_writable("--metrics-out", Path(tc.metrics_out), is_dir=False)
    for flag, path in (("--plots", tc.plots), ("--export", tc.export), ("--checkpoint-dir", tc.checkpoint_dir)):
        if path:
            _check_writable(flag, Path(path), is_dir=True)


def _check_writable(flag: str, path: Path, is_dir: bool) -> None:
    """A directory (created with its parents if missing) or a file (its directory must exist)."""
    if path.exists() and path.is_dir() != is_dir:
        raise InvalidInputError(f"{flag} {path} is a {'file' if is_dir else 'directory'}, not a "
                                f"{'directory' if is_dir else 'file'}")
    if is_dir:
        where = path
        while not where.exists():
            where = where.parent
    else:
        where = path.parent
        if not where.is_dir():
            raise InvalidInputError(f"{flag} {path}: directory {where} does not exist")
    if not where.is_dir() or not os.access(where, os.W_OK | os.X_OK):
        raise InvalidInputError(f"{flag} {path}: {where} is not a writable directory")


def physical_memory() -> int | None:
    """Bytes of memory this process may use: physical memory, or its container's limit if lower;
    None when the system does not say."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    try:
        limit = _CGROUP_MEMORY_MAX.read_text().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def memory_floor(n_fields: int, n_dense: int, model, minibatch_share: int, tiers) -> dict:
    """Bytes of host memory a job surely allocates, by what for (a lower bound: rows, caches and
    the rest of the tables come on top). model: ``ModelOptions``; minibatch_share: examples per
    rank per update; tiers: ``TierConfig``."""
    widths = [n_fields * model.embedding_dim + n_dense, *model.hidden, 1]
    layers = [a * b for a, b in zip(widths, widths[1:])]
    n_params = sum(layers) + sum(widths[1:])
    if tiers.device != "cpu":  # parameters and activations live on the GPU; drawn on the host
        return {"host float64 draw of the largest dense layer": 12 * max(layers)}
    need = {
        "dense parameters, gradients and optimizer state":
            4 * n_params * (2 + _DENSE_SLOTS.get(model.dense_optimizer, 0)),
        "MLP input of one mini-batch and its gradient": 2 * 4 * minibatch_share * widths[0],
    }
    if tiers.hbm_capacity:  # the slot keys are written (EMPTY_KEY) when the table is built
        need["HBM-PS slot keys"] = 8 * slots_for(tiers.hbm_capacity, DEFAULT_MAX_LOAD_FACTOR)
    return need


def check_memory(n_fields: int, n_dense: int, cfg, n_ranks: int) -> None:
    """cfg: ``Config``. Raises before anything is allocated when ``memory_floor`` exceeds
    ``physical_memory`` (which would end in a MemoryError or an OOM kill later)."""
    have = physical_memory()
    share = -(-cfg.train.minibatch_size // n_ranks)
    need = memory_floor(n_fields, n_dense, cfg.model, share, cfg.tiers)
    if have is None or sum(need.values()) <= have:
        return
    parts = ", ".join(f"{what} {b / 2**30:,.1f} GiB" for what, b in need.items())
    raise InvalidInputError(
        f"this job needs at least {sum(need.values()) / 2**30:,.1f} GiB of memory ({parts}; "
        f"{n_fields} fields x embedding-dim {cfg.model.embedding_dim}, hidden {list(cfg.model.hidden)}) "
        f"but this machine has {have / 2**30:,.1f} GiB: lower --embedding-dim, --hidden, "
        f"--minibatch-size or --hbm-capacity")
