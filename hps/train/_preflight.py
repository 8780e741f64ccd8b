"""Checks a job makes before it trains, so one that cannot finish fails in its first seconds.

- ``check_outputs``: ``--plots`` has matplotlib; every output path (``--metrics-out``, ``--plots``,
  ``--export``, ``--checkpoint-dir``) can be written (``hps.cli.check_writable``).
- ``check_memory``: what the model and the HBM-PS table will surely allocate on the host fits in
  the job's memory budget (``_budget``; an explicit budget was checked against the machine).
- ``first_working_set``: the keys of the first batch, which the memory plan is checked against.

Each raises ``InvalidInputError`` with one line naming the flag to change. (The data is checked by
the readers' ``probe()``.)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .._options import format_bytes
from ..cli import check_writable
from ..comm import SPARSE_KEYS
from ..errors import InvalidInputError
from ..formats._export import check_export_dir
from ..mem import unique_keys
from ..table import DEFAULT_MAX_LOAD_FACTOR, slots_for

#: Dense optimizer -> float32 state tensors per parameter.
_DENSE_SLOTS = {"adam": 2, "adagrad": 1, "sgd": 0}


def check_outputs(tc) -> None:
    """tc: ``TrainConfig``. Raises when an output of the job could not be written after training."""
    if tc.plots:
        from ._plots import require

        require()
    if tc.metrics_out:
        check_writable("--metrics-out", Path(tc.metrics_out), is_dir=False)
    for flag, path in (("--plots", tc.plots), ("--export", tc.export), ("--checkpoint-dir", tc.checkpoint_dir)):
        if path:
            check_writable(flag, Path(path), is_dir=True)
    if tc.export:   # before training, not after: files of the export's names no export wrote
        check_export_dir(tc.export)


def memory_floor(n_fields: int, n_dense: int, model, minibatch_share: int, tiers) -> dict:
    """Bytes of host memory the model of a job surely allocates, by what for: the model's share of
    the memory plan (rows, caches, tables and batches come on top). model: ``ModelOptions``;
    minibatch_share: examples per rank per update; tiers: ``TierConfig``."""
    from ..model import ModelConfig, dense_shapes

    shapes = dense_shapes(ModelConfig.from_options(model, n_fields, n_dense, seed=0)).values()
    layers = [math.prod(s) for s in shapes if len(s) == 2]
    n_params = sum(math.prod(s) for s in shapes)
    input_width = n_fields * model.embedding_dim + n_dense  # pooled fields | dense: every model's input
    if tiers.device != "cpu":  # parameters and activations live on the GPU; drawn on the host
        return {"host float64 draw of the largest dense layer": 12 * max(layers)}
    return {
        "dense parameters, gradients and optimizer state":
            4 * n_params * (2 + _DENSE_SLOTS.get(model.dense_optimizer, 0)),
        "network input of one mini-batch and its gradient": 2 * 4 * minibatch_share * input_width,
        "activations of one mini-batch and their gradients": 2 * 4 * minibatch_share * sum(
            s[-1] for s in shapes if len(s) == 2),
    }


def check_memory(n_fields: int, n_dense: int, cfg, n_ranks: int, budget: tuple[int, str]) -> dict:
    """cfg: ``Config``; budget: (this rank's memory budget, where it came from). Raises before
    anything is allocated when ``memory_floor`` exceeds the budget (which would end in a
    MemoryError or an OOM kill later) -> the floor, the model's share of the plan."""
    share = -(-cfg.train.minibatch_size // n_ranks)
    model = memory_floor(n_fields, n_dense, cfg.model, share, cfg.tiers)
    need = dict(model)
    if cfg.tiers.hbm_capacity and cfg.tiers.device == "cpu":   # its slot keys are written when it is built
        need["HBM-PS slot keys"] = 8 * slots_for(cfg.tiers.hbm_capacity, DEFAULT_MAX_LOAD_FACTOR)
    have, source = budget
    if sum(need.values()) <= have:
        return model
    parts = ", ".join(f"{what} {format_bytes(b)}" for what, b in need.items())
    raise InvalidInputError(
        f"this job needs at least {format_bytes(sum(need.values()))} of memory ({parts}; "
        f"{n_fields} fields x embedding-dim {cfg.model.embedding_dim}, hidden {list(cfg.model.hidden)}) "
        f"but its memory budget is {format_bytes(have)} ({source}): lower --embedding-dim, --hidden, "
        f"--minibatch-size or --hbm-capacity, or raise --mem-budget")


def first_working_set(feed, coll, replicated: bool):
    """-> (this rank's first local batch (a Batch, or None), keys this rank will hold resident for the
    first batch, how many of them it owns): the working set the memory plan is checked against before
    training starts. Each rank parses only its own first local batch; the keys meet at their owners
    (``owner``) or are gathered by every rank (``replicated``: ``allreduce``). ``coll``: the job's
    ``Collectives``; collective over its main channel."""
    batches = feed.epoch()
    first = next(batches, None)
    batches.close()  # a suspended reader would hold its file open
    local = unique_keys(first.data.keys) if first is not None else np.empty(0, np.uint64)
    first = first.data if first is not None else None
    if replicated:
        everyone = unique_keys(coll.main.allgatherv(local, SPARSE_KEYS))
        return first, everyone.shape[0], int(coll.owned_mask(everyone).sum())
    asked = coll.main.exchange_by_owner(local, SPARSE_KEYS)[0]
    owned = unique_keys(asked).shape[0]
    return first, owned, owned
