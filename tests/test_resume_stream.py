"""A checkpoint records the example stream it was trained on (files, format, shards and their cut,
batch sizes, shuffle, seed); ``--resume`` refuses one of another stream before anything is loaded,
naming what differs, and resumes an older checkpoint that records none with a warning."""


import shutil

import pytest

from hps.data._shards import SHARD_CUT
from hps.formats import _checkpoint
from hps.formats._manifest import read_meta, write_meta
from hps.train import main
from tests.test_train import SMALL, assert_same_model, run_cli
from tests.test_train_mpi import criteo_file

NEWEST = "ckpt-00000005"  # SMALL: 12,000 rows in batches of 2,048, one epoch


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(the uninterrupted 2-epoch model, a checkpoint directory after epoch 1)."""
    d = tmp_path_factory.mktemp("runs")
    full, _ = run_cli(d, "full", "--epochs", "2")
    ck = d / "ck"
    run_cli(d, "half", "--checkpoint-dir", str(ck))
    return full, ck


def _copy(ck, tmp_path):
    shutil.copytree(ck, tmp_path / "ck")
    return tmp_path / "ck"


def _resume(ck, *extra):
    return main([*SMALL, "--epochs", "2", "--checkpoint-dir", str(ck), "--resume", *extra])


def test_a_checkpoint_records_its_stream(runs):
    stream = read_meta(runs[1] / NEWEST / "meta.json")["stream"]
    assert stream["format"] == "synthetic" and stream["files"] == []
    assert (stream["batch_size"], stream["minibatch_size"], stream["shards"]) == (2048, 256, 1)
    assert stream["shard_cut"] == SHARD_CUT and stream["options"]["rows"] == 12000


@pytest.mark.parametrize("flag, value, said", [
    ("--batch-size", "1024", "--batch-size: 2048 there, 1024 now"),
    ("--minibatch-size", "512", "--minibatch-size: 256 there, 512 now"),
    ("--data-shards", "2", "the data shards (--data-shards, or one per rank): 1 there, 2 now"),
    ("--shuffle-buffer", "100", "--shuffle-buffer: 0 there, 100 now"),
    ("--seed", "7", "--seed: 0 there, 7 now"),
    ("--rows", "13000", '"rows": 12000'),
])
def test_resuming_on_another_stream_is_refused_naming_the_difference(runs, tmp_path, capsys, flag, value, said):
    assert _resume(_copy(runs[1], tmp_path), flag, value) == 2
    err = capsys.readouterr().err
    assert "was trained on another example stream" in err and said in err, err
    assert "resume with the command that wrote it plus --resume" in err


def test_the_same_stream_resumes_to_the_uninterrupted_model(runs, tmp_path):
    ck = _copy(runs[1], tmp_path)
    resumed, _ = run_cli(tmp_path, "resumed", "--epochs", "2", "--checkpoint-dir", str(ck), "--resume")
    assert_same_model(runs[0], resumed, 0.0)


def test_a_checkpoint_without_a_stream_resumes_with_a_warning(runs, tmp_path, capsys):
    ck = _copy(runs[1], tmp_path)
    meta = read_meta(ck / NEWEST / "meta.json")
    del meta["stream"]
    write_meta(ck / NEWEST / "meta.json", meta)
    resumed, _ = run_cli(tmp_path, "resumed", "--epochs", "2", "--checkpoint-dir", str(ck), "--resume")
    assert "did not record its input: resuming unchecked" in capsys.readouterr().out
    assert_same_model(runs[0], resumed, 0.0)


def test_a_data_file_changed_since_the_checkpoint_is_refused(tmp_path, capsys):
    data = tmp_path / "d.tsv"
    criteo_file(data, n=3000)
    job = ["--format", "criteo", "--data", str(data), "--batch-size", "1024", "--minibatch-size", "256",
           "--hidden", "8", "--embedding-dim", "4", "--no-progress", "--checkpoint-dir", str(tmp_path / "ck")]
    assert main(job) == 0
    assert main([*job, "--resume", "--epochs", "2"]) == 0  # the same file: resumes
    capsys.readouterr()
    with data.open("a") as f:  # a day's data appended to the file
        f.write(data.read_text().splitlines()[-1] + "\n")
    assert main([*job, "--resume", "--epochs", "3"]) == 2
    err = capsys.readouterr().err
    assert "--data: 1 file(s) of " in err and "was trained on another example stream" in err, err


def test_load_asks_before_it_restores_anything(runs):
    """``accept`` runs before the store or the model is touched: a refusal leaves them as they were."""

    class Untouchable:
        dim = 16

        def import_h5(self, path):
            raise AssertionError("restored before accept")

    class Model:
        name = "ctr"

        def load_state_dict(self, params):
            raise AssertionError("restored before accept")

    class Coll:
        rank, size = 0, 1

        def allgather(self, x):
            return [x]

    seen = []

    def refuse(meta, where):
        seen.append((meta["index"], where))
        raise ValueError("another stream")

    with pytest.raises(ValueError, match="another stream"):
        _checkpoint.load(runs[1], Coll(), Untouchable(), Model(), None, accept=refuse)
    assert seen == [(5, str(runs[1] / NEWEST))]
