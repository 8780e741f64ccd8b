"""The records the trainer's pipeline hands its features (``_features``): one batch on its way through
the stages (:class:`Work`), what ``start`` gets (:class:`Start`) and what ``after_batch`` may do with a
batch just trained (:class:`BatchJob`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._feed import LocalBatch


@dataclass
class Work:
    """One batch on its way through the pipeline. Written by one stage at a time, in stage order."""

    epoch: int
    batch: int             # index within the epoch
    index: int             # global batch counter (resume-stable)
    local: LocalBatch      # this rank's examples of the global batch
    n_total: np.ndarray | None = None  # (P,) int64 examples of each global mini-batch (all ranks)
    last_in_epoch: bool = False
    plans: list | None = None    # one ``_sync.Plan`` per local mini-batch (prepare; place on the device path)
    uploaded: object | None = None  # its raw arrays on the device (``_device_batch``: prepare to place)
    prepared: object | None = None  # the rows fetched for the HBM-PS (``_hierarchy.Prepared``)
    staged: list | None = None   # the step's inputs of every mini-batch (``Backend.stage``, place)
    hot: np.ndarray | None = None  # (P,) bool: the mini-batches all-hot on every rank (FAE), or None
    keep_state: bool = False     # a checkpoint of this batch may be written: features keep their state
    states: dict = field(default_factory=dict)  # feature name -> its state after this batch's prepare


@dataclass
class Start:
    """What the features' ``start`` hooks get: the hierarchy (``_hierarchy.ParameterHierarchy``), the
    checkpoint resumed (its meta, or None) and the log."""

    hier: object
    resumed: dict | None
    log: object


class BatchJob:
    """What the features' ``after_batch`` hooks may do with the batch just trained: ``evaluate()`` ->
    (AUC, logloss) of the model as it is, and ``save()``, which writes a checkpoint of the batch at
    most once however often it is asked (for the best model, and when one is due). Both collective
    over the train channel."""

    def __init__(self, evaluate, save):
        self.evaluate, self._save, self.saved = evaluate, save, None

    def save(self) -> None:
        if self.saved is None:
            self.saved = self._save()
