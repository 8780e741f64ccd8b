"""--readers N: training with N reader threads is training with one — every format's batches, the
shards of --data-shards, --shuffle-buffer, a resume in the middle of an epoch and the malformed-line
report — and the default number of readers comes from the rank's cores and is printed at start."""

import numpy as np
import pytest

from hps.config import Config
from hps.formats import _checkpoint
from hps.train._feed import MAX_DEFAULT_READERS, OTHER_STAGE_CORES, Feed, reader_threads
from tests.test_data_criteo import _assert_same, _random_lines
from hps.train import load_export, main
from tests.test_train import SMALL, assert_same_model, run_cli

MODEL = ["--hidden", "16,8", "--embedding-dim", "8", "--no-progress"]


def _run_file(tmp_path, name, *args):
    """A job on file data (SMALL's synthetic options would be refused): (export, metrics)."""
    import json

    out, m = tmp_path / name, tmp_path / f"{name}.json"
    assert main([*MODEL, *args, "--export", str(out), "--metrics-out", str(m)]) == 0
    return load_export(out, first_order=True), json.loads(m.read_text())


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    p = tmp_path_factory.mktemp("criteo") / "d.txt"
    lines = _random_lines(np.random.default_rng(3), 3000, bad_rate=0.004)
    p.write_text("\n".join(lines) + "\n")
    return p


def _flat(criteo, **kw):
    return dict(format="criteo", data=str(criteo), batch_size=512, minibatch_size=128, data_shards=2,
                shuffle_buffer=700, **kw)


def test_the_feed_composes_the_same_local_batches_with_any_readers(criteo):
    one = list(Feed(Config.from_flat(_flat(criteo, readers=1)), 0, 1).epoch(1))
    for n in (2, 3):
        feed = Feed(Config.from_flat(_flat(criteo, readers=n)), 0, 1)
        assert feed.reader_threads == n
        many = list(feed.epoch(1))
        assert len(many) == len(one)
        for a, b in zip(one, many):
            np.testing.assert_array_equal(a.bounds, b.bounds)
            _assert_same(a.data, b.data)


def test_malformed_reports_are_the_same_with_any_readers(criteo):
    reports = []
    for n in (1, 3):
        feed = Feed(Config.from_flat(_flat(criteo, readers=n)), 0, 1)
        for _ in feed.epoch(0):
            pass
        reports.append(feed.malformed())
    assert reports[0][0] > 0 and reports[0] == reports[1]


def test_training_with_three_readers_is_training_with_one_and_resumes_mid_epoch(criteo, tmp_path, capsys):
    base = ["--format", "criteo", "--data", str(criteo), "--eval-data", str(criteo), "--batch-size", "512", "--minibatch-size", "128",
            "--data-shards", "2", "--shuffle-buffer", "700", "--epochs", "2"]
    one, m1 = _run_file(tmp_path, "one", *base, "--readers", "1")
    ck = tmp_path / "ck"
    three, m3 = _run_file(tmp_path, "three", *base, "--readers", "3", "--checkpoint-dir", str(ck),
                        "--checkpoint-every", "2", "--keep-checkpoints", "9")
    assert "readers 3" in capsys.readouterr().out
    assert_same_model(one, three, 0.0)
    assert m1["auc"] == m3["auc"] and m1["malformed_lines"] == m3["malformed_lines"] > 0
    assert m1["malformed_first"] == m3["malformed_first"]
    mid = _checkpoint.checkpoint_name(7)  # after batch 1 of the 6 of epoch 1 (its own shuffle)
    assert (ck / mid).is_dir()
    _checkpoint.point_latest(ck, mid)
    resumed, _ = _run_file(tmp_path, "resumed", *base, "--readers", "2", "--checkpoint-dir", str(ck), "--resume")
    assert_same_model(one, resumed, 0.0)


def test_synthetic_training_is_the_same_with_two_readers(tmp_path):
    one, m1 = run_cli(tmp_path, "one", "--readers", "1")
    two, m2 = run_cli(tmp_path, "two", "--readers", "2")
    assert_same_model(one, two, 0.0)
    assert m1["auc"] == m2["auc"]


def test_the_default_leaves_cores_to_the_other_stages():
    assert reader_threads(None, 1) == reader_threads(None, 2) == 1
    assert reader_threads(None, OTHER_STAGE_CORES + 2) == 2
    assert reader_threads(None, 128) == MAX_DEFAULT_READERS
    assert reader_threads(5, 2) == 5


def test_the_start_line_names_the_readers(tmp_path, capsys):
    run_cli(tmp_path, "plain")
    out = capsys.readouterr().out
    assert "readers 1)" in out or f"readers {reader_threads(None, 2)}" in out


@pytest.mark.parametrize("bad", ["0", "-2"])
def test_bad_readers_flag_is_one_clear_error(bad, capsys):
    assert main([*SMALL, "--readers", bad]) == 2
    assert "readers must be positive" in capsys.readouterr().err


def test_batches_are_read_in_threads_named_for_it(criteo):
    import threading

    seen = set()
    feed = Feed(Config.from_flat(_flat(criteo, readers=2)), 0, 1)
    orig = feed.readers[0]._work

    def spy(unit):
        seen.add(threading.current_thread().name.split("_")[0])
        return orig(unit)

    feed.readers[0]._work = spy
    assert sum(len(b.data) for b in feed.epoch(0)) > 0
    assert seen == {"hps-reader"}
