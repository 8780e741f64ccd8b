"""The dense model's host threads while training (``hps/train/_blas.py``): decided between batches
from the pipeline's stage timings, on synthetic timings (among them those of the README's jobs) and
in a real run."""

from types import SimpleNamespace

import numpy as np
import pytest

from hps import InvalidInputError
from hps.comm._wait import node_cores
from hps.train._blas import GROW_SHARE, KEEP_SHARE, DenseThreads


def _times(read, prepare, place, train):
    return {k: SimpleNamespace(busy=v) for k, v in
            {"read": read, "prepare": prepare, "place": place, "train": train}.items()}


@pytest.mark.parametrize("stages, wall, want", [
    # the README's runs (bench/results/train-scale.json: read, prepare, place busy seconds, wall):
    ((8.43, 110.32, 15.41), 124.58, 1),    # larger than DRAM (SSD-bound prepare): stays at one thread
    ((0.70, 1.25, 0.27), 2.15, 1),         # its in-memory baseline: the stages keep ~1 core busy
    ((0.76, 4.75, 0.18), 4.90, 1),         # the 10 % budget out-of-core job
    ((0.56, 0.71, 0.07), 5.40, 2),         # the 2-core Criteo-format wdl job (issue figures): one idle core
    ((0.0, 0.0, 0.0), 1.0, 2),             # nothing else runs
])
def test_two_cores_decisions_on_measured_jobs(stages, wall, want):
    assert DenseThreads(None, cores=2).decide(sum(stages), wall) == want


def test_grows_to_the_idle_cores_and_shrinks_with_a_margin():
    dt = DenseThreads(None, cores=4)                   # spare = 3 - others
    assert dt.threads == 4                             # every core until a window is measured
    assert dt.decide(0.8, 1.0) == 3                    # spare 2.2: helpers 1 and 2 (>= 0.5, >= 1.5), not 3
    assert dt.decide(0.0, 1.0) == 4                    # spare 3 >= 2 + GROW_SHARE
    assert dt.decide(1 - KEEP_SHARE - 0.01, 1.0) == 4  # spare 2.31: helper 3 kept (>= 2 + KEEP_SHARE)
    assert dt.decide(0.75, 1.0) == 3                   # spare 2.25: dropped
    assert dt.decide(3.0, 1.0) == 1                    # every core busy: the train thread alone
    assert dt.decide(0.6, 1.0) == 3                    # spare 2.4: back to 3, not 4
    assert dt.decide(1 - GROW_SHARE, 1.0) == 4
    two = DenseThreads(None, cores=2)
    assert two.decide(0.5, 1.0) == 2 and two.decide(0.69, 1.0) == 2 and two.decide(0.71, 1.0) == 1
    assert two.decide(0.6, 1.0) == 1                   # 0.4 idle: not enough to add it back


def test_one_core_and_fixed_counts_never_change():
    assert DenseThreads(None, cores=1).decide(0.0, 1.0) == 1
    fixed = DenseThreads(3, cores=2)
    assert fixed.threads == 3 and fixed.decide(5.0, 1.0) == 3 and fixed.label == 3
    assert DenseThreads(None, cores=2).label == "auto (1-2)"
    with pytest.raises(InvalidInputError, match="--blas-threads"):
        DenseThreads(0, cores=4)


class _Model:
    def __init__(self):
        self.threads, self.calls = 1, []
        self.helper_cpu_seconds = 0.0

    def set_threads(self, n):
        self.threads = n
        self.calls.append(n)


def test_after_batch_measures_a_window_and_applies_it_to_the_model():
    dt = DenseThreads(None, cores=2, window=2)
    m = _Model()
    with dt.bound(m):
        assert m.threads == 2                                               # starts on every core
        # batch 1: only a mark; batch 2: the others busy 0.8 s in 1 s -> the helper goes
        assert dt.after_batch(_times(0.1, 0.1, 0.0, 1.0), now=1.0) == 2
        assert dt.after_batch(_times(0.5, 0.5, 0.0, 2.0), now=2.0) == 1 and m.threads == 1
        # the train stage's own time never counts; window 1..3: 0.45 core busy -> back
        assert dt.after_batch(_times(0.55, 0.55, 0.0, 9.0), now=3.0) == 2 and m.threads == 2
        assert dt.after_batch(_times(0.75, 0.75, 0.0, 9.0), now=4.0) == 2   # window 2..4: 0.25 core
        assert dt.after_batch(_times(1.2, 1.2, 0.0, 9.0), now=5.0) == 2     # window 3..5: 0.65 core, kept
        assert dt.after_batch(_times(1.7, 1.7, 0.0, 9.0), now=6.0) == 1     # window 4..6: 0.95 core
        assert m.threads == 1
    assert m.calls == [2, 1, 2, 1, 1]  # the last: helpers stopped on leaving
    # each batch counted at the threads it trained with: 2, 2, then 1, then 2, 2, 2
    assert dt.metrics() == {"dense_threads": "auto (1-2)", "dense_threads_batches": {1: 1, 2: 5}}


def test_the_helpers_cpu_since_bound_goes_to_the_train_stage():
    """The train stage's CPU figure counts the chunk helpers' CPU (theirs since the model was bound)."""
    dt = DenseThreads(2, cores=2)
    m = _Model()
    m.helper_cpu_seconds = 5.0                         # spent before: e.g. another job's passes
    times = {k: SimpleNamespace(busy=0.0, helper_cpu=0.0) for k in ("read", "prepare", "place", "train")}
    with dt.bound(m):
        m.helper_cpu_seconds = 5.75
        dt.after_batch(times, now=1.0)
        assert times["train"].helper_cpu == pytest.approx(0.75)
        assert all(times[k].helper_cpu == 0.0 for k in ("read", "prepare", "place"))
        m.helper_cpu_seconds = 6.0
        dt.after_batch(times, now=2.0)
        assert times["train"].helper_cpu == pytest.approx(1.0)  # cumulative, not added twice


def test_a_training_run_reports_its_thread_counts(tmp_path):
    """A real run: the counts used add up to the batches trained and the run ends with the model's
    helpers stopped; a fixed --blas-threads is used for every batch."""
    import threading

    from hps.config import Config
    from hps.train import run

    flat = dict(rows=6000, fields=4, vocab_per_field=300, batch_size=1000, minibatch_size=500, hidden=(8,),
                embedding_dim=4, progress=False, ssd_path=str(tmp_path / "ssd"))
    m = run(Config.from_flat(flat), log=lambda *a, **k: None)
    assert m["dense_threads"].startswith("auto") and sum(m["dense_threads_batches"].values()) == 6
    assert set(m["dense_threads_batches"]) <= set(range(1, node_cores() + 1))
    assert not [t for t in threading.enumerate() if t.name.startswith("hps-chunk-")]
    fixed = run(Config.from_flat({**flat, "blas_threads": 2}), log=lambda *a, **k: None)
    assert fixed["dense_threads"] == 2 and fixed["dense_threads_batches"] == {2: 6}
    assert np.isclose(fixed["auc"], m["auc"], atol=0, rtol=0)  # the thread count never changes results
