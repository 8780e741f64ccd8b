"""Training control: ``--eval-every N`` (the eval curve) and ``--early-stop P`` (the stop and the best
checkpoint), run by the trainer's train stage.

**Evaluation during training.** After every N-th global batch (batch ``index`` with ``(index + 1) %
N == 0``) the train stage evaluates the model as it is then on the eval data (``Trainer.evaluate``
over the train channel: every rank predicts its shards with rows pulled from their owners, read
only, so the tiers are left as they were) and appends ``{"batch", "examples", "auc", "logloss"}`` to
the curve (``eval_curve`` in the metrics; ``--plots`` draws it beside the training loss).

**Early stopping.** An evaluation whose AUC is not above the best so far counts as one without
improvement; after P in a row training stops after that batch. Every evaluation that improves is
the new best: with ``--checkpoint-dir`` a checkpoint of that batch is written (unless the batch
wrote one anyway) and kept whatever ``--keep-checkpoints`` says, and when training stops ``LATEST``
is switched to it, so ``--resume`` continues from the best model and ``last_checkpoint`` names it
(``best_eval`` in the metrics: batch, AUC, checkpoint). Checkpoints hold this state (the curve, the
best, the evaluations without improvement) in ``meta.json``, as of the end of their batch: a resumed
run goes on with it.

**The export is of the best model** (Keras' ``restore_best_weights``): with ``--early-stop`` the
export is written from the best checkpoint (:meth:`TrainingControl.export_choice`) — a cut of the
model after its batch, as nothing is prepared past an evaluation before it ends
(:meth:`TrainingControl.cut_before`) — and its
``model.json`` and the log say which batch it is from. Without ``--checkpoint-dir`` the best
checkpoints go to ``EXPORT/.best-checkpoint`` (:func:`best_dir`; removed once the export is
written). The final evaluation is of the model at the stop (the report says so beside the best).

**Stopping a pipeline that runs ahead.** Batches after ``stop`` are not trained. The read stage
keeps reading until every rank has seen the decision (ranks agree on it with the batch sizes), and
``prepare`` runs for batches up to ``stop + WINDOW`` exactly (any later one starts only after
``train(stop + 1)``, so every rank knows by then): the state after the stop (admission counts,
expiry) is the same whatever the timing.

Thread safety: :meth:`after_batch` runs in the train stage; ``stop`` is written there once and
read by the read and prepare stages.
"""

from __future__ import annotations

import os

from ..formats import BEST_DIR, checkpoint_name


def best_dir(tc) -> str | None:
    """Where the best checkpoints go (``tc``: TrainConfig): ``--checkpoint-dir``; else, with
    ``--early-stop`` and ``--export``, the private BEST_DIR of the export; else None (not kept)."""
    if tc.checkpoint_dir:
        return tc.checkpoint_dir
    return os.path.join(tc.export, BEST_DIR) if tc.early_stop and tc.export else None


def run_name(cfg) -> str:
    """A short name of the run for plots: model, data and the options that shape it (admission,
    expiry, shuffling, the learning-rate schedule)."""
    d, m, tc = cfg.data, cfg.model, cfg.train
    data = os.path.basename(str(d.data).rstrip("/")) if d.data else f"synthetic {d.rows:,} rows"
    extra = [f"{k.replace('_', '-')} {getattr(tc, k)}" for k in ("admit_after", "expire_after", "shuffle_buffer")
             if getattr(tc, k)]
    if tc.lr_warmup or tc.lr_decay != "none":
        extra.append(f"lr warm-up {tc.lr_warmup}, {tc.lr_decay} decay")
    return f"{m.model} on {data}" + (f" ({'; '.join(extra)})" if extra else "")


def summary(m: dict) -> list[str]:
    """Lines of the end-of-run report on the metrics ``m``: evaluations during training, early
    stopping, admission and expiry (nothing when none of them ran)."""
    lines = []
    curve = m.get("eval_curve") or []
    if curve:
        lines.append(f"{len(curve)} evaluations during training: AUC " +
                     " ".join(f"{c['auc']:.4f}" for c in curve[-8:]) + (" (last 8)" if len(curve) > 8 else ""))
    best = m.get("best_eval")
    if best:
        stop = m.get("early_stopped_after_batch")
        where = f" (checkpoint {best['checkpoint']})" if best.get("checkpoint") else ""
        lines.append((f"early stop after batch {stop}" if stop is not None else "no early stop") +
                     f"; best eval AUC {best['auc']:.4f} after batch {best['batch']}{where}")
    if "admitted_keys" in m:
        lines.append(f"admission/expiry: {m['admitted_keys']:,} keys admitted, {m['expired_keys']:,} expired, "
                     f"{m['known_keys']:,} with a row")
    return lines


class TrainingControl:
    """The eval curve and the early stop of one trainer (see the module docstring). ``every``: N
    (0 = no evaluation during training, also without eval data); ``patience``: P (0 = never stop);
    ``window``: the trainer's residency window."""

    def __init__(self, every: int, patience: int, window: int, checkpoint_dir: str | None = None):
        self.every, self.patience, self.window = int(every), int(patience), int(window)
        self.checkpoint_dir = checkpoint_dir
        self.curve: list[dict] = []
        self.best: dict | None = None
        self.bad = 0
        self.examples = 0              # examples trained so far (the curve's x axis)
        self.stop: int | None = None   # the last batch trained, once early stopping decided
        self.last: int | None = None   # the last batch trained so far

    def due(self, index: int) -> bool:
        """Whether batch ``index`` ends with an evaluation."""
        return bool(self.every) and (index + 1) % self.every == 0

    def keeps_best(self, index: int) -> bool:
        """Whether batch ``index`` may need a best checkpoint (early stopping evaluates there)."""
        return bool(self.patience) and self.due(index)

    def cut_before(self, index: int) -> bool:
        """Whether ``prepare(index)`` must wait for ``train(index - 1)``: that batch ends with an
        evaluation that may keep the best checkpoint, which must be the model after that batch — no
        row yet born, fetched or expired for a later batch — so that the evaluation, the best
        checkpoint and the export of the best model do not depend on how far the pipeline ran ahead."""
        return self.keeps_best(index - 1)

    @property
    def stopping(self) -> bool:
        return self.stop is not None

    def skip_train(self, index: int) -> bool:
        return self.stop is not None and index > self.stop

    def skip_prepare(self, index: int) -> bool:
        return self.stop is not None and index > self.stop + self.window

    def pinned(self) -> tuple:
        """Checkpoint names pruning must keep (the best one)."""
        return (os.path.basename(self.best["checkpoint"]),) if self.best and self.best.get("checkpoint") else ()

    def after_batch(self, index: int, examples: int, evaluate, save) -> None:
        """After training batch ``index`` (of ``examples`` examples): evaluate when due
        (``evaluate()`` -> AUC and logloss, the same on every rank), keep the curve and the best,
        and decide the stop. ``save()`` writes a checkpoint of this batch (with ``--checkpoint-dir``),
        after the state here was updated, so the checkpoint holds it."""
        self.examples += int(examples)
        self.last = index
        if not self.due(index):
            return
        auc, logloss = evaluate()
        self.curve.append({"batch": index, "examples": self.examples, "auc": auc, "logloss": logloss})
        if not self.patience:
            return
        if self.best is None or auc > self.best["auc"]:
            path = os.path.join(self.checkpoint_dir, checkpoint_name(index)) if self.checkpoint_dir else None
            self.best, self.bad = {"batch": index, "auc": auc, "checkpoint": path}, 0
            if path:
                save()
            return
        self.bad += 1
        if self.bad >= self.patience:
            self.stop = index

    def export_choice(self) -> tuple[str | None, dict]:
        """What the export holds -> ``(checkpoint to export, or None for the model as it is, record)``;
        the record (for model.json and the log): ``batch`` (the last batch the model trained),
        ``source``, ``eval_auc`` (None when that batch was not evaluated) and ``best`` (whether it
        is the best checkpoint rather than the model as it is). With early stopping it is the best
        model, unless that is the model as it is."""
        best = self.best
        if self.patience and best and best.get("checkpoint") and best["batch"] != self.last:
            # by its name in this run's directory: a resume from another working directory, or of a
            # directory moved since, finds it where the path recorded at the time would not
            path = os.path.join(self.checkpoint_dir, os.path.basename(best["checkpoint"]))
            return path, {"batch": best["batch"], "eval_auc": best["auc"], "best": True,
                          "source": f"the best model (checkpoint {path})"}
        auc = self.curve[-1]["auc"] if self.curve and self.curve[-1]["batch"] == self.last else None
        return None, {"batch": self.last, "eval_auc": auc, "best": False, "source": "the model at the end of training"}

    def state(self) -> dict:
        """The curve, the best, the count without improvement, the stop (JSON; checkpoints)."""
        return {"curve": self.curve, "best": self.best, "bad": self.bad, "examples": self.examples,
                "stop": self.stop, "last": self.last}

    def load_state(self, st: dict) -> None:
        """Restore :meth:`state` (resume)."""
        self.curve, self.best, self.bad = list(st["curve"]), st["best"], int(st["bad"])
        self.examples, self.stop, self.last = int(st["examples"]), st["stop"], st.get("last")

    def metrics(self) -> dict:
        out = {"eval_curve": self.curve}
        if self.patience:
            out["best_eval"] = self.best
            out["early_stopped_after_batch"] = self.stop
        return out
