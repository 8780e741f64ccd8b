"""FAE in the trainer (seeds/003 §4.2-4.3): an empty hot set is the baseline run; with hot rows pinned,
spilling, checkpoints/resume and profile files keep their guarantees; mini-batches are all-hot or
all-cold; the Shuffle Scheduler follows Eq. 5."""

import json

import numpy as np
import pytest

from hps.data import Batch
from hps.profile import read_profile
from hps.profile._main import main as profile_main
from hps.train import load_export, main
from hps.train._backend import HostBackend
from hps.train._fae import ShuffleScheduler, Fae
from hps.train._hot_rows import HotRows
from tests.budgets import train_with_cache_rows
from hps.train._feed import LocalBatch
from tests.test_train import SMALL, assert_same_model, run_cli

FAE = ["--fae", "auto", "--hot-bytes", "64KiB", "--fae-sample-rate", "50"]


def test_an_empty_hot_set_trains_exactly_the_baseline(tmp_path):
    base, mbase = run_cli(tmp_path, "base", "--epochs", "2")
    fae, mfae = run_cli(tmp_path, "fae", "--epochs", "2", "--fae", "auto", "--hot-bytes", "0")
    assert mfae["fae"]["hot_rows"] == 0 and mfae["fae"]["hot_examples"] == 0 and mfae["fae"]["swaps"] == 0
    assert_same_model(base, fae, 1e-5)
    assert mfae["auc"] == mbase["auc"] and mfae["logloss"] == mbase["logloss"]
    assert mfae["loss_per_batch"] == mbase["loss_per_batch"]


def test_hot_rows_train_apart_and_reach_the_export_through_a_spilling_hierarchy(tmp_path):
    """Hot mini-batches happen, every key of the baseline is in the export (hot rows were written
    back), and a MEM-PS budget of ~12 % of the table (rows spill to SSD-PS) changes nothing."""
    shape = ["--batch-size", "512", "--minibatch-size", "128"]
    base, mbase = run_cli(tmp_path, "base", *shape)
    ref, mref = run_cli(tmp_path, "fae", *shape, *FAE)
    f = mref["fae"]
    assert f["hot_rows"] > 0 and f["hot_minibatches"] > 0 and f["cold_minibatches"] > 0 and f["swaps"] > 0
    assert 0 < f["hot_input_fraction"] < 1 and f["hot_examples"] < mref["examples"]
    np.testing.assert_array_equal(np.sort(ref[0]), np.sort(base[0]))  # the hot keys are in the export
    # an HBM-PS cache of 2,048 rows and a MEM-PS cache of an eighth of the table
    mspill = train_with_cache_rows([*SMALL, *shape, *FAE, "--rows-per-file", "256", "--hbm-budget", "400KiB"],
                                   ref[0].shape[0] // 8, tmp_path / "spill")
    spill = load_export(tmp_path / "spill", first_order=True)
    assert mspill["ssd_bytes_read"] > 0
    assert_same_model(ref, spill, 1e-6)
    assert mspill["fae"] == {**mref["fae"], "profile": mspill["fae"]["profile"]}
    assert mref["auc"] > 0.6  # it learned (accuracy against the baseline: bench_fae)


def test_resume_restores_hot_rows_and_the_scheduler(tmp_path):
    full, mfull = run_cli(tmp_path, "full", "--epochs", "2", *FAE)
    ck = tmp_path / "ck"
    run_cli(tmp_path, "half", "--epochs", "1", "--checkpoint-dir", str(ck), *FAE)
    meta = json.loads(next(ck.glob("ckpt-*/meta.json")).read_text())
    assert meta["fae"]["swaps"] > 0 and meta["fae"]["hot_rows"] == mfull["fae"]["hot_rows"]
    resumed, mres = run_cli(tmp_path, "resumed", "--epochs", "2", "--checkpoint-dir", str(ck), "--resume", *FAE)
    assert mres["fae"]["swaps"] == mfull["fae"]["swaps"] and mres["fae"]["final_rate"] == mfull["fae"]["final_rate"]
    assert_same_model(full, resumed, 1e-5)
    # another hot set cannot continue this checkpoint
    code = main([*SMALL, "--epochs", "2", "--checkpoint-dir", str(ck), "--resume", "--fae", "auto",
                 "--hot-bytes", "8KiB"])
    assert code == 2


def test_a_profile_file_trains_like_auto(tmp_path, capsys):
    prof = tmp_path / "p.h5"
    assert profile_main(["--rows", "12000", "--fields", "4", "--vocab-per-field", "3000", "--batch-size", "2048",
                         "--hot-bytes", "64KiB", "--row-bytes", "72", "--sample-rate", "50",
                         "--out", str(prof)]) == 0
    auto, mauto = run_cli(tmp_path, "auto", *FAE)
    assert read_profile(prof).hot_keys.shape[0] == mauto["fae"]["hot_rows"]
    filed, mfiled = run_cli(tmp_path, "filed", "--fae", str(prof))
    assert_same_model(auto, filed, 0.0)
    # a smaller --hot-bytes keeps the most accessed keys of the profile
    _, msmall = run_cli(tmp_path, "small", "--fae", str(prof), "--hot-bytes", "720")
    assert msmall["fae"]["hot_rows"] == 10
    assert main([*SMALL, "--fae", str(tmp_path / "missing.h5")]) == 2
    assert "cannot open FAE profile" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [(["--fae", "auto"], "needs --hot-bytes"),
                                           (["--hot-bytes", "1k"], "option of --fae"),
                                           (["--fae", "auto", "--hot-bytes", "1k", "--fae-sample-rate", "0"],
                                            "fae-sample-rate"),
                                           (["--fae", "auto", "--hot-bytes", "1k", "--consistency", "het"],
                                            "it needs --consistency bsp"),
                                           (["--fae", "auto", "--hot-bytes", "1k", "--admit-after", "3"],
                                            "drop --admit-after or --fae")])
def test_bad_fae_options_are_one_clear_line(args, message, capsys):
    assert main([*SMALL, *args]) == 2
    assert message in capsys.readouterr().err


class _Local:
    """A one-process channel."""

    rank, size = 0, 1

    def allsum_array(self, a):
        return a


def test_split_forms_all_hot_and_all_cold_minibatches():
    # 8 examples of 2 keys each in 2 mini-batches of 4; keys < 10 are hot
    keys = np.array([1, 2, 1, 50, 3, 4, 60, 61, 2, 3, 1, 70, 4, 4, 80, 1], np.uint64)
    n = 8
    batch = Batch(np.arange(n, dtype=np.float32), np.zeros((n, 0), np.float32), keys, np.zeros(16, np.int32),
                  np.ones(16, np.float32), np.arange(0, 17, 2, dtype=np.int64), 2)
    hot = HotRows(None, 2, 4, HostBackend(None))
    hot.pin(np.arange(1, 10, dtype=np.uint64), np.zeros((9, 4), np.float32))
    # hot examples: 0, 2 (mini-batch 0), 4, 6 (mini-batch 1): round(4 / size) hot mini-batches
    for size, want in ((3, [[1, 3], [5, 7], [0, 2, 4, 6]]), (2, [[1, 3], [5, 7], [0, 2], [4, 6]]),
                       (10, [[0, 1, 2, 3], [4, 5, 6, 7]])):  # under half a mini-batch: no hot one
        fae = Fae(hot, ShuffleScheduler(), size, None, {})
        local, flags = fae.split(LocalBatch(batch, np.array([0, 4, 8], np.int64)), _Local())
        labels = [local.minibatch(j).labels.tolist() for j in range(len(flags))]
        assert flags.tolist() == [False, False] + [True] * (len(want) - 2) and labels == want
        for j, lab in enumerate(labels):  # every example moved with its own keys
            mb = local.minibatch(j)
            np.testing.assert_array_equal(mb.keys, np.concatenate([keys[2 * int(i):2 * int(i) + 2] for i in lab]))
            assert not flags[j] or hot.mask(mb.keys).all()


def test_the_shuffle_scheduler_follows_eq_5():
    s = ShuffleScheduler()
    assert s.rate == 50
    s.swap(1.0)                      # first swap: nothing to compare with
    assert s.rate == 50
    s.swap(1.1)                      # loss rose: halve
    assert s.rate == 25
    for loss in (1.0, 0.9, 0.8):     # three falls: unchanged
        s.swap(loss)
    assert s.rate == 25
    s.swap(0.7)                      # the fourth fall in a row (u = 4): double
    assert s.rate == 50 and s.streak == 0
    for _ in range(10):
        s.swap(s.prev_loss + 1)      # never below R(1)
    assert s.rate == 1


def test_strips_alternate_cold_first_by_the_rate():
    fae = Fae(HotRows(None, 2, 4, HostBackend(None)), ShuffleScheduler(rate=50), 4, None, {})
    n_total = np.array([5, 5, 5, 5, 0, 5, 5], np.int64)
    hot = np.array([0, 0, 0, 0, 0, 1, 1], bool)
    losses = iter([3.0, 2.0, 1.0])
    got = list(fae.order(n_total, hot, lambda: next(losses)))
    assert got == [0, 1, 5, 2, 3, 6]   # R(50): 2 of 4 cold, 1 of 2 hot, ...; the empty one skipped
    assert fae.sched.swaps == 3


def test_read_owned_serves_a_prepared_row_from_the_hbm_ps():
    """FAE's held-out loss reads rows while training runs: a key of a batch prepared but not yet
    trained has its current row in the HBM-PS, which prepare filled (it used to read as zeros)."""
    from hps.mem import MemPS, RowInitializer
    from hps.table import HashTable
    from hps.train._collectives import Collectives
    from hps.train._hierarchy import ParameterHierarchy
    from tests.reference.store import DictStore

    init = RowInitializer(2, 4, seed=0)
    mem = MemPS(DictStore(4), 4, initializer=init, capacity_rows=64)
    hier = ParameterHierarchy(HashTable(64, 4), mem, window=3, owned_mask=Collectives().owned_mask)
    keys = np.arange(1, 9, dtype=np.uint64)
    hier.prepare(0, keys)                        # not trained
    np.testing.assert_array_equal(hier.read_owned(keys), init(keys))
    hier.hbm.insert(keys[:2], np.full((2, 4), 7, np.float32))  # trained rows: HBM-PS is the holder
    assert (hier.read_owned(keys)[:2] == 7).all()


def test_resume_without_eval_data_keeps_the_loss_of_the_strip_in_progress(tmp_path):
    """Without eval data the scheduler's loss is the training loss since the last swap: a checkpoint
    records the strip in progress (summed over ranks), so resume reproduces the uninterrupted run."""
    from tests.test_train_mpi import criteo_args, criteo_file

    args = [*criteo_args(criteo_file(tmp_path / "train.txt"), eval_data=False), *FAE]
    ck = tmp_path / "ck"
    runs = {"full": ["--epochs", "2"], "half": ["--epochs", "1", "--checkpoint-dir", str(ck)],
            "resumed": ["--epochs", "2", "--checkpoint-dir", str(ck), "--resume"]}
    for name, extra in runs.items():
        assert main([*args, *extra, "--export", str(tmp_path / name)]) == 0
        if name == "half":
            saved = json.loads(next(ck.glob("ckpt-*/meta.json")).read_text())["fae"]
            assert saved["strip_examples"] > 0 and saved["strip_loss"] > 0 and saved["swaps"] > 0
    from hps.train import load_export
    assert_same_model(load_export(tmp_path / "full", first_order=True),
                      load_export(tmp_path / "resumed", first_order=True), 1e-5)


class _TwoRanks:
    """A channel of two ranks whose other rank sent the same buffer: the sum doubles it."""

    rank, size = 0, 2

    def __init__(self):
        self.calls = 0

    def dense_allreduce(self, a):
        self.calls += 1
        return 2 * a


def test_a_fused_hot_step_leaves_its_buffer_and_applies_like_the_unfused_one():
    from hps.model import SparseAdagrad

    keys = np.array([3, 5, 9, 11], np.uint64)
    rows = np.arange(4 * 4, dtype=np.float32).reshape(4, 4) / 10
    slots, grads = np.array([0, 2]), np.array([[0.1, -0.2], [0.3, 0.4]], np.float32)
    plain, fused = (HotRows(SparseAdagrad(lr=0.1), 2, 4, HostBackend(None), fused=f) for f in (False, True))
    for hot in (plain, fused):
        hot.pin(keys, rows)
    ch_plain, ch_fused = _TwoRanks(), _TwoRanks()
    plain.step(slots, slots, grads, ch_plain)                # all-reduces and applies at once
    fused.step(slots, slots, grads, ch_fused)                # leaves its buffer to the dense sync
    buf = fused.take_pending()
    assert ch_plain.calls == 1 and ch_fused.calls == 0
    assert buf.shape == (4 * 3,) and fused.take_pending() is None
    np.testing.assert_array_equal(fused.rows, rows)         # nothing applied yet
    fused.apply(2 * buf)                                     # what the dense sync's fused all-reduce gives
    np.testing.assert_array_equal(fused.rows, plain.rows)
    assert not np.array_equal(plain.rows[[0, 2]], rows[[0, 2]])   # touched rows moved
    np.testing.assert_array_equal(plain.rows[[1, 3]], rows[[1, 3]])  # untouched rows stay


def test_an_evaluation_during_training_sees_the_hot_rows_as_they_are(tmp_path):
    """--eval-every with FAE: the hot rows train in their pinned copies, and the MEM-PS/SSD-PS get them
    only at write-backs (checkpoints, the end); an evaluation during training must read the pinned
    ones. The one after the last batch and the final one see the same model (they once differed: the
    first read the hot rows as pinned at the start)."""
    _, m = run_cli(tmp_path, "fae", *FAE, "--eval-every", "1")
    assert m["fae"]["hot_rows"] > 0 and m["eval_curve"][-1]["examples"] == m["examples"]
    assert m["eval_curve"][-1]["auc"] == m["auc"] and m["eval_curve"][-1]["logloss"] == m["logloss"]
