"""Learning-rate schedules (``--lr-warmup STEPS``, ``--lr-decay {none,cosine,step}``,
``--lr-decay-steps S``), for the sparse (row) and the dense optimizer alike.

A *step* is one global mini-batch: mini-batch ``j`` of global batch ``index`` is step
``index * P + j`` (P = mini-batches of a full batch), so the step of an update depends neither on
the number of ranks nor on a resume (a shorter last batch of an epoch leaves a gap). At step t the
learning rate of each optimizer is its base rate (``--lr``, ``--dense-lr``) times

    warm-up:  min(1, (t + 1) / STEPS)                        (1 without --lr-warmup)
    decay, with u = max(0, t - STEPS) the steps after the warm-up:
      none:   1
      cosine: (1 + cos(pi * min(u, S) / S)) / 2              (reaches 0 at u = S and stays there)
      step:   0.1 ** floor(u / S)

Not thread-safe: the train stage calls :meth:`LRSchedule.apply` before each mini-batch's updates.
"""

from __future__ import annotations

import math

from ..config import LR_DECAYS
from ..errors import InvalidInputError
from ._features import Feature

#: Factor of a ``step`` decay every ``--lr-decay-steps`` steps (torch's StepLR default gamma).
STEP_GAMMA = 0.1


def lr_factor(step: int, warmup: int = 0, decay: str = "none", decay_steps: int = 0) -> float:
    """The factor of the base learning rate at ``step`` (see the module docstring)."""
    if decay not in LR_DECAYS:
        raise InvalidInputError(f"lr decay must be one of {', '.join(LR_DECAYS)}; got {decay!r}")
    f = min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0
    u = max(0, step - warmup)
    if decay == "cosine":
        f *= 0.5 * (1.0 + math.cos(math.pi * min(u, decay_steps) / decay_steps))
    elif decay == "step":
        f *= STEP_GAMMA ** (u // decay_steps)
    return f


class LRSchedule(Feature):
    """Sets the learning rate ``lr`` of each of ``opts`` (the sparse and the dense optimizer) for each
    step, from their rates at construction. ``warmup``, ``decay``, ``decay_steps``: ``--lr-warmup``,
    ``--lr-decay``, ``--lr-decay-steps``; ``per_batch``: mini-batches of a full global batch. A feature
    (``_features``): it sets the rates before every mini-batch."""

    name = "schedule"

    def __init__(self, warmup: int, decay: str, decay_steps: int, per_batch: int, opts):
        self.warmup, self.decay, self.decay_steps = int(warmup), decay, int(decay_steps)
        self.per_batch = int(per_batch)
        self.opts = [(o, float(o.lr)) for o in opts]

    @property
    def active(self) -> bool:
        return self.warmup > 0 or self.decay != "none"

    def step_of(self, index: int, j: int) -> int:
        return int(index) * self.per_batch + int(j)

    def apply(self, index: int, j: int) -> float:
        """Set the rates of mini-batch ``j`` of batch ``index`` -> the factor."""
        f = lr_factor(self.step_of(index, j), self.warmup, self.decay, self.decay_steps)
        for opt, base in self.opts:
            opt.lr = base * f
        return f

    def before_minibatch(self, w, j: int) -> None:
        self.apply(w.index, j)
