"""Training features as strategies: how admission/expiry, FAE, HET, EASGD, the learning-rate schedule and
training control plug into the trainer's pipeline.

As TorchRec's sharders plug into its model-parallel wrapper, each feature is an object built apart —
from its own options and the narrow inputs it needs (a channel, the hot rows, a callable), never the
trainer — that overrides the hooks of :class:`Feature` it needs; the trainer calls every hook of
:class:`Features` at its place in the pipeline and has no branch of its own per feature.

=======================  ===================  =====================================================
hook                     where (thread)       implemented by
=======================  ===================  =====================================================
``on_read``              read                 FAE (all-hot / all-cold mini-batches, seeds/003 §4.3)
``stops_reading``        read                 control (no batch read past an early stop)
``stops_epochs``         read, epoch end      control (collective: no next epoch after a stop)
``skips``                prepare, train       control (batches past the stop)
``prepare_horizon``      prepare's gate       HET (nothing prepared past a consistent cut), control
                                              (nothing prepared past a batch that may be the best)
``on_prepare``           prepare              admission (keys not admitted -> their field's row)
``on_resident``          prepare              expiry (keys used now; the sweep)
``keeps_state``          prepare              control (a best checkpoint may follow the batch)
``order``                train                FAE (the Shuffle Scheduler's order, Eq. 5)
``before_minibatch``     train                the learning-rate schedule
``after_minibatch``      train                FAE (the strip's loss)
``end_batch``            train, before the    HET (a consistent cut flushes the caches)
                         batch counts trained
``holds_batch``          train                control (the batch counts trained after its evaluation)
``after_batch``          train                control (evaluation, the best checkpoint, the stop)
``start`` / ``finish``   caller               FAE (pin / write back the hot rows), EASGD (centre)
``save`` / ``read_…``    train / caller       admission, FAE, EASGD, control (checkpoint state)
``eval_keys``            caller, train        admission (evaluation scores shared rows)
``export_choice``        caller               control (after an early stop the best checkpoint)
``metrics``              caller               every feature that reports figures
=======================  ===================  =====================================================

A hook that communicates says so; every rank has the same features, so they meet in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Feature", "Features", "Checkpoint"]


@dataclass
class Checkpoint:
    """What the features add to a checkpoint of batch ``index``: ``meta`` (JSON, meta.json),
    ``writers`` (``write(h5file)`` of this rank's own state, into its sparse file) and ``pinned``
    (checkpoint names pruning must keep)."""

    index: int
    meta: dict
    writers: list = field(default_factory=list)
    pinned: list = field(default_factory=list)


class Feature:
    """The hooks (see the module docstring); each does nothing unless a feature overrides it. ``w`` is
    the pipeline's record of one batch (``_trainer.Work``: its indices, LocalBatch, plans, ``hot``
    flags and ``states``, what features took in prepare for a checkpoint of the batch)."""

    #: key of the feature's per-rank figures and prepare-stage state
    name = "feature"
    #: whether the feature reads a batch's keys on the host (its working set, its mini-batches' keys):
    #: then they are deduplicated there, not on the device (``_device_batch``)
    needs_host_keys = False

    # -- read stage ----------------------------------------------------------------------------------
    def on_read(self, w, ch) -> None:
        """A batch was read (``w.local``; may be regrouped). ``ch``: the read channel."""

    def stops_reading(self, index: int) -> bool:
        """Whether no batch after ``index`` needs to be read."""
        return False

    def stops_epochs(self, ch) -> bool:
        """At the end of an epoch: whether training ends here. May be collective over ``ch``."""
        return False

    # -- prepare stage -------------------------------------------------------------------------------
    def skips(self, index: int, stage: str) -> bool:
        """Whether batch ``index`` is left out of ``stage`` ("prepare" or "train")."""
        return False

    def prepare_horizon(self, w) -> int | None:
        """A batch that must be trained before ``w`` is prepared (beyond the residency window)."""
        return None

    def on_prepare(self, w) -> None:
        """Before the batch is planned (``w.local``'s keys may be rewritten). Prepare channel."""

    def on_resident(self, w, resident) -> None:
        """The batch's working set on this rank (``resident`` (k,) uint64) is resident now (host keys
        for a feature that ``needs_host_keys``; else they may be ``_device_batch.DeviceKeys``)."""

    def keeps_state(self, index: int) -> bool:
        """Whether a checkpoint of batch ``index`` may be written besides the trainer's schedule."""
        return False

    # -- train stage ---------------------------------------------------------------------------------
    def order(self, w):
        """The order of ``w``'s mini-batches to train (indices), or None for no opinion."""
        return None

    def before_minibatch(self, w, j: int) -> None:
        """Before mini-batch ``j`` of ``w`` is trained."""

    def after_minibatch(self, w, j: int, n: int, loss) -> None:
        """Mini-batch ``j`` of ``n`` examples (all ranks) was trained; ``loss()``: this rank's term."""

    def end_batch(self, w) -> None:
        """``w`` was trained; the prepare stage waits for it. May be collective over the train channel."""

    def holds_batch(self, index: int) -> bool:
        """Whether batch ``index`` counts as trained (``prepare`` of later batches may go on) only after
        its :meth:`after_batch` hooks and its checkpoint, rather than before them."""
        return False

    def after_batch(self, w, job) -> None:
        """``w`` was trained (it counts as trained unless a feature holds it). ``job.evaluate()`` -> (AUC, logloss), ``job.save()`` writes a
        checkpoint of ``w`` (both collective over the train channel)."""

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self, job) -> None:
        """Before the first batch (``job.hier``, ``job.resumed``: the checkpoint's meta or None,
        ``job.log``). May be collective over the main channel."""

    def finish(self) -> None:
        """After the last batch. May be collective."""

    def close(self) -> None:
        """Release threads and files (idempotent)."""

    # -- checkpoints ----------------------------------------------------------------------------------
    def save(self, w, ckpt: Checkpoint) -> None:
        """Add this feature's state as of batch ``ckpt.index`` to ``ckpt`` (``w``: that batch, or None
        after training). Train thread; may be collective over the train channel."""

    def read_checkpoint(self, h) -> None:
        """Read this rank's state from its checkpoint file ``h`` (an open h5py File)."""

    def restore(self, meta: dict) -> None:
        """After a checkpoint was loaded (its ``meta``): take its state."""

    # -- evaluation and metrics -----------------------------------------------------------------------
    def export_choice(self, last: int | None):
        """What an export holds -> ``(checkpoint to export, or None for the model as it is, record)``
        (``_control.TrainingControl.export_choice``), or None for no opinion. ``last``: the last batch
        this run trained."""
        return None

    def eval_keys(self, keys, ch):
        """The keys (n,) uint64 an evaluation looks up for ``keys`` (collective over ``ch``)."""
        return keys

    def rank_metrics(self):
        """This rank's figures (picklable), gathered into :meth:`metrics`'s ``per_rank``."""
        return None

    def metrics(self, per_rank: list) -> dict:
        """Job metrics from every rank's :meth:`rank_metrics` (in rank order)."""
        return {}


class Features:
    """The features of one trainer, in order; each hook calls every feature's."""

    def __init__(self, features):
        self.all = list(features)

    def __iter__(self):
        return iter(self.all)

    def on_read(self, w, ch) -> None:
        for f in self.all:
            f.on_read(w, ch)

    def stops_reading(self, index: int) -> bool:
        return any(f.stops_reading(index) for f in self.all)

    def stops_epochs(self, ch) -> bool:
        return any([f.stops_epochs(ch) for f in self.all])  # a list: every collective runs

    def skips(self, index: int, stage: str) -> bool:
        return any(f.skips(index, stage) for f in self.all)

    def prepare_horizon(self, w) -> int | None:
        got = [h for h in (f.prepare_horizon(w) for f in self.all) if h is not None]
        return max(got) if got else None

    def on_prepare(self, w) -> None:
        for f in self.all:
            f.on_prepare(w)

    def on_resident(self, w, resident) -> None:
        for f in self.all:
            f.on_resident(w, resident)

    def keeps_state(self, index: int) -> bool:
        return any(f.keeps_state(index) for f in self.all)

    def order(self, w):
        for f in self.all:
            got = f.order(w)
            if got is not None:
                return got
        return range(len(w.plans))

    def before_minibatch(self, w, j: int) -> None:
        for f in self.all:
            f.before_minibatch(w, j)

    def after_minibatch(self, w, j: int, n: int, loss) -> None:
        for f in self.all:
            f.after_minibatch(w, j, n, loss)

    def end_batch(self, w) -> None:
        for f in self.all:
            f.end_batch(w)

    def holds_batch(self, index: int) -> bool:
        return any(f.holds_batch(index) for f in self.all)

    def after_batch(self, w, job) -> None:
        for f in self.all:
            f.after_batch(w, job)

    def start(self, job) -> None:
        for f in self.all:
            f.start(job)

    def finish(self) -> None:
        for f in self.all:
            f.finish()

    def close(self) -> None:
        for f in self.all:
            f.close()

    def save(self, w, ckpt: Checkpoint) -> None:
        for f in self.all:
            f.save(w, ckpt)

    def read_checkpoint(self, h) -> None:
        for f in self.all:
            f.read_checkpoint(h)

    def restore(self, meta: dict) -> None:
        for f in self.all:
            f.restore(meta)

    def export_choice(self, last: int | None):
        """The first feature's choice; without one, the model as it is."""
        for f in self.all:
            got = f.export_choice(last)
            if got is not None:
                return got
        return None, {"batch": last, "eval_auc": None, "best": False, "source": "the model at the end of training"}

    def eval_keys(self, keys, ch):
        for f in self.all:
            keys = f.eval_keys(keys, ch)
        return keys

    def rank_metrics(self) -> dict:
        return {f.name: f.rank_metrics() for f in self.all}

    def metrics(self, per_rank: list) -> dict:
        out = {}
        for f in self.all:
            out.update(f.metrics([r[f.name] for r in per_rank]))
        return out
