"""Training control (``--eval-every``, ``--early-stop``: ``_control.TrainingControl``) as a feature of the
trainer's pipeline (``_features``): it evaluates after the batches it is due, keeps the best checkpoint
(a cut of the model after its batch: nothing is prepared past that batch before its evaluation and
checkpoint end), stops reading, preparing and training past an early stop, switches ``LATEST`` to the
best checkpoint at the end of a stopped run, and chooses what the export holds (the best model)."""

from __future__ import annotations

from ..formats import point_latest
from ._control import TrainingControl
from ._features import Feature


class ControlFeature(Feature):
    """``control``: the TrainingControl (its ``checkpoint_dir``: where the best checkpoints go, None:
    not kept); ``run_name``: the run's name in the metrics (plots); ``writes_latest``: whether this
    rank points ``LATEST`` at the best checkpoint (one writer: rank 0)."""

    name = "control"

    def __init__(self, control: TrainingControl, run_name: str, writes_latest: bool):
        self.c, self.run_name, self.writes_latest = control, run_name, bool(writes_latest)

    def stops_reading(self, index: int) -> bool:
        """Early stopping decided and batch ``index`` is past what ``prepare`` still runs."""
        return self.c.skip_prepare(index + 1)

    def stops_epochs(self, ch) -> bool:
        """Early stop: no next epoch (collective over ``ch`` when stopping is possible)."""
        return bool(self.c.patience) and ch.any(self.c.stopping)

    def skips(self, index: int, stage: str) -> bool:
        return self.c.skip_train(index) if stage == "train" else self.c.skip_prepare(index)

    def prepare_horizon(self, w) -> int | None:
        """The best checkpoint is the model after its batch: ``w`` waits for that batch's evaluation."""
        return w.index - 1 + self.c.window if self.c.cut_before(w.index) else None

    def keeps_state(self, index: int) -> bool:
        return self.c.keeps_best(index)

    def holds_batch(self, index: int) -> bool:
        return self.c.keeps_best(index)  # prepare(index + 1) waits for the evaluation, the best too

    def after_batch(self, w, job) -> None:
        self.c.after_batch(w.index, int(w.n_total.sum()), job.evaluate, job.save)

    def finish(self) -> None:
        """A stopped run ends with ``LATEST`` at the best checkpoint, so ``--resume`` continues from it."""
        if self.c.stop is not None and self.c.pinned() and self.writes_latest:
            point_latest(self.c.checkpoint_dir, self.c.pinned()[0])

    def export_choice(self, last: int | None):
        """After ``--early-stop`` the best checkpoint, else the model as it is (``TrainingControl.export_choice``)."""
        return self.c.export_choice()

    def save(self, w, ckpt) -> None:
        ckpt.meta["control"] = self.c.state()
        ckpt.pinned.extend(self.c.pinned())

    def restore(self, meta: dict) -> None:
        if "control" in meta:  # the eval curve, the best, early stopping (absent before it existed)
            self.c.load_state(meta["control"])

    def metrics(self, per_rank: list) -> dict:
        return {"run_name": self.run_name, **self.c.metrics()}
