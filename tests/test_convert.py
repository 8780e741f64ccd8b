"""python -m hps.convert: pre-hashed Parquet that reads as the source's batches (every format, every
shard count it recorded), trains the same model, and refuses bad input with one line naming the file."""

import gzip
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hps.convert import convert
from hps.convert._main import main as convert_main
from hps.data import ConvertedReader, open_dataset
from hps.data._converted import MANIFEST, META_KEY
from hps.errors import InvalidInputError
from hps.train import load_export
from hps.train import main as train_main
from tests.test_data_criteo import _assert_same, _random_lines
from tests.test_data_readers import _csv, _libsvm, _parquet
from tests.test_train import assert_same_model


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    d = tmp_path_factory.mktemp("criteo")
    lines = _random_lines(np.random.default_rng(7), 4000, bad_rate=0.003)
    (d / "a.txt").write_text("\n".join(lines[:2500]) + "\n")
    (d / "b.txt.gz").write_bytes(gzip.compress(("\n".join(lines[2500:]) + "\n").encode()))
    return d


def _same_batches(src, fmt, out, k, batch=300, **opts):
    for s in range(k):
        a = list(open_dataset(src, fmt, batch, shard=(s, k), max_malformed=0.1, **opts).batches())
        conv = open_dataset(out, "parquet", batch, shard=(s, k), readers=2)
        assert isinstance(conv, ConvertedReader)
        b = list(conv.batches())
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)


@pytest.mark.parametrize("fmt", ["criteo", "csv", "libsvm", "parquet"])
def test_converted_data_reads_as_the_source_for_every_recorded_shard_count(tmp_path, criteo, fmt):
    src = {"criteo": lambda: criteo, "csv": lambda: _csv(tmp_path), "libsvm": lambda: _libsvm(tmp_path),
           "parquet": lambda: _parquet(tmp_path)}[fmt]()
    opts = {"dense_columns": ["x"]} if fmt in ("csv", "parquet") else {}
    out = tmp_path / "out"
    man = convert(fmt, src, out, opts, rows_per_file=700, max_shards=3, readers=2, max_malformed=0.1)
    assert len(man["files"]) > 1 and man["malformed"] > 0
    for k in (1, 2, 3):
        _same_batches(src, fmt, out, k, **opts)
    parts = [p for p in out.iterdir() if p.name.endswith(".parquet")]
    assert {p.name for p in parts} == {f["name"] for f in man["files"]}
    assert not list(tmp_path.glob(".out.hps-*"))  # nothing left beside it


def test_synthetic_train_and_eval_splits(tmp_path):
    kw = dict(rows=5000, fields=3, vocab_per_field=100, n_dense=2, seed=4, block_rows=1000)
    convert("synthetic", None, tmp_path / "tr", kw, max_shards=2, batch_size=1000)
    convert("synthetic", None, tmp_path / "ev", dict(kw, split="eval"), batch_size=1000)
    for s, k in ((0, 1), (0, 2), (1, 2)):
        a = list(open_dataset(None, "synthetic", 700, shard=(s, k), **kw).batches())
        b = list(open_dataset(tmp_path / "tr", "parquet", 700, shard=(s, k)).batches())
        for x, y in zip(a, b):
            _assert_same(x, y)
    ev = list(open_dataset(None, "synthetic", 700, **kw).eval_batches())
    for x, y in zip(ev, open_dataset(tmp_path / "ev", "parquet", 700).batches()):
        _assert_same(x, y)


TRAIN = ["--batch-size", "512", "--minibatch-size", "128", "--hidden", "16,8", "--embedding-dim", "8",
         "--epochs", "2", "--no-progress"]


def _train(tmp_path, name, *args):
    out, m = tmp_path / name, tmp_path / f"{name}.json"
    assert train_main([*TRAIN, *args, "--export", str(out), "--metrics-out", str(m)]) == 0
    return load_export(out, first_order=True), json.loads(m.read_text())


@pytest.mark.parametrize("shards", [1, 2])
def test_training_from_the_conversion_is_training_from_the_source(tmp_path, criteo, shards):
    ev = tmp_path / "ev.txt"
    ev.write_text("\n".join(_random_lines(np.random.default_rng(8), 800)) + "\n")
    assert convert_main(["--format", "criteo", "--data", str(criteo), "--out", str(tmp_path / "tr"),
                         "--max-malformed", "0.1", "--no-progress", "--rows-per-file", "1500"]) == 0
    assert convert_main(["--format", "criteo", "--data", str(ev), "--out", str(tmp_path / "ev"), "--no-progress"]) == 0
    flags = ["--data-shards", str(shards), "--max-malformed", "0.1"]
    src, msrc = _train(tmp_path, "src", "--format", "criteo", "--data", str(criteo), "--eval-data", str(ev), *flags)
    conv, mconv = _train(tmp_path, "conv", "--format", "parquet", "--data", str(tmp_path / "tr"), "--eval-data",
                         str(tmp_path / "ev"), *flags, "--readers", "2")
    assert_same_model(src, conv, 1e-6)
    assert round(msrc["auc"], 4) == round(mconv["auc"], 4)


def _damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[len(data) // 3] ^= 0x5A  # inside a data page: its CRC catches it
    else:
        data = data[: len(data) // 2]
    path.write_bytes(bytes(data))


@pytest.fixture
def converted(tmp_path, criteo):
    out = tmp_path / "conv"
    convert("criteo", criteo, out, max_malformed=0.1, rows_per_file=1500)
    return out


def _fails(capsys, args, needle):
    assert train_main(["--format", "parquet", *args, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hps: error: ") and needle in err, err
    return err


@pytest.mark.parametrize("how", ["flip", "cut"])
def test_a_damaged_file_is_one_line_naming_it_and_nothing_is_exported(tmp_path, converted, capsys, how):
    part = converted / "part-00001.parquet"
    _damage(part, how)
    _fails(capsys, ["--data", str(converted), "--export", str(tmp_path / "model")], str(part))
    assert not (tmp_path / "model").exists()


def test_a_missing_file_is_one_line_naming_it(converted, capsys):
    (converted / "part-00001.parquet").unlink()
    _fails(capsys, ["--data", str(converted)], "part-00001.parquet is missing")


def test_files_of_two_conversions_are_refused(tmp_path, converted, criteo, capsys):
    other = tmp_path / "other"
    convert("criteo", criteo, other, max_malformed=0.1, rows_per_file=1500)
    shutil.copy(other / "part-00001.parquet", converted / "part-00001.parquet")
    _fails(capsys, ["--data", str(converted)], "part-00001.parquet")
    _fails(capsys, ["--data", str(converted / "part-00000.parquet"), str(other / "part-00001.parquet")],
           "is from another conversion")


def test_a_schema_that_is_not_hps_is_refused(converted, capsys):
    part = converted / "part-00000.parquet"
    t = pq.read_table(part)
    meta = t.schema.metadata
    pq.write_table(pa.table({"label": t.column("label"), "junk": t.column("label")}).replace_schema_metadata(meta),
                   part)
    _fails(capsys, ["--data", str(part)], f"{part}: columns ['label', 'junk'] are not those hps.convert writes")


def test_keys_of_another_hashing_version_are_a_clear_error(converted, capsys):
    part = converted / "part-00000.parquet"
    t = pq.read_table(part)
    meta = json.loads(t.schema.metadata[META_KEY])
    meta["hashing"] = 0
    pq.write_table(t.replace_schema_metadata({META_KEY: json.dumps(meta).encode()}), part)
    _fails(capsys, ["--data", str(part)], "hashed by hps hashing version 0")


def test_out_must_be_empty_or_an_earlier_conversion(tmp_path, criteo, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["--format", "criteo", "--data", str(criteo), "--out", str(out), "--no-progress", "--max-malformed", "0.1"]
    assert convert_main(args) == 2
    assert "not empty and holds no earlier conversion" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    (out / "notes.txt").unlink()
    assert convert_main(args) == 0
    first = json.loads((out / MANIFEST).read_text())["conversion"]
    assert convert_main(args) == 0  # over its own earlier conversion: replaced
    assert json.loads((out / MANIFEST).read_text())["conversion"] != first
    (out / "notes.txt").write_text("mine")
    assert convert_main(args) == 2  # a conversion plus a file it did not write: refused, untouched
    assert "notes.txt" in capsys.readouterr().err and (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_conversion_leaves_out_as_it_was(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_text("\n".join(_random_lines(np.random.default_rng(1), 3000, bad_rate=0.3)) + "\n")
    out = tmp_path / "out"
    assert convert_main(["--format", "criteo", "--data", str(bad), "--out", str(out), "--no-progress"]) == 2
    assert "malformed" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]


def test_out_in_a_missing_directory_or_the_working_directory(tmp_path, criteo, capsys, monkeypatch):
    """--out a/b/c without a/b: one line naming the directory (it was an OSError naming a temporary path);
    --out . (empty): the conversion goes there (it converted everything, then failed to remove ".")."""
    assert convert_main(["--format", "criteo", "--data", str(criteo), "--out", str(tmp_path / "a" / "b" / "c"),
                         "--max-malformed", "0.1", "--no-progress"]) == 2
    assert f"its directory {tmp_path / 'a' / 'b'} does not exist" in capsys.readouterr().err
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    assert convert_main(["--format", "criteo", "--data", str(criteo), "--out", ".", "--max-malformed", "0.1",
                         "--no-progress"]) == 0
    assert open_dataset(tmp_path / "here", "parquet", 10).rows > 0


def test_column_options_must_match_the_conversion(tmp_path):
    src = _csv(tmp_path)
    convert("csv", src, tmp_path / "out", {"dense_columns": ["x"]}, max_malformed=0.1)
    with pytest.raises(InvalidInputError, match="converted from csv with dense_columns"):
        open_dataset(tmp_path / "out", "parquet", 10, dense_columns=["a"])
    assert open_dataset(tmp_path / "out", "parquet", 10, dense_columns=["x"]).n_dense == 1


def test_data_standardized_with_its_own_statistics_is_refused_where_others_are_given(tmp_path):
    """A conversion standardizes with its own data's statistics; read as eval or scoring data of a job that
    trained on another (the training data's statistics given), it would be on another scale: refused."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a, b = _csv(tmp_path / "a"), _csv(tmp_path / "b", n=500)   # other rows: other statistics
    for src, out in ((a, "ca"), (b, "cb")):
        convert("csv", src, tmp_path / out, {"dense_columns": ["x"], "dense_transform": "standardize"},
                max_malformed=0.1)
    stats = open_dataset(tmp_path / "ca", "parquet", 10).dense_stats
    assert open_dataset(tmp_path / "ca", "parquet", 10, dense_stats=stats).n_dense == 1   # its own: fine
    with pytest.raises(InvalidInputError, match="standardized .* with its own dense statistics"):
        open_dataset(tmp_path / "cb", "parquet", 10, dense_stats=stats)


def test_dense_stats_from_a_conversion_or_an_export_standardizes_eval_data_as_the_training_data(tmp_path):
    """``--dense-stats-from``: eval data converted with the training data's statistics (of its conversion,
    or of the model's export) is the eval data a job standardizing with those reads, and scores alike."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    a, b = _csv(tmp_path / "a"), _csv(tmp_path / "b", n=500)
    cols = ["--dense-columns", "x", "--dense-transform", "standardize", "--max-malformed", "0.1", "--no-progress"]
    assert convert_main(["--format", "csv", "--data", str(a), "--out", str(tmp_path / "ca"), *cols]) == 0
    stats = open_dataset(tmp_path / "ca", "parquet", 10).dense_stats
    _train(tmp_path, "m", "--format", "parquet", "--data", str(tmp_path / "ca"))
    want = open_dataset(b, "csv", 1000, dense_columns=["x"], dense_transform="standardize", dense_stats=stats,
                        max_malformed=0.1)
    want = np.concatenate([x.dense for x in want.batches()])
    for src in ("ca", "m"):
        out = tmp_path / f"cb-{src}"
        assert convert_main(["--format", "csv", "--data", str(b), "--out", str(out), *cols,
                             "--dense-stats-from", str(tmp_path / src)]) == 0
        ds = open_dataset(out, "parquet", 1000, dense_stats=stats)   # as training's eval reads it: not refused
        assert ds.dense_stats == stats
        np.testing.assert_array_equal(np.concatenate([x.dense for x in ds.batches()]), want)
    assert train_main([*TRAIN, "--format", "parquet", "--data", str(tmp_path / "ca"),
                       "--eval-data", str(tmp_path / "cb-m")]) == 0
    from hps.predict import Predictor

    pred = Predictor(tmp_path / "m")                            # scoring: the raw data and its conversion alike
    raw, conv = pred.predict(b, max_malformed=0.1), pred.predict(tmp_path / "cb-m")
    assert raw[0].shape[0] > 400
    for x, y in zip(raw, conv):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("case", ["no-transform", "not-a-model", "not-standardized"])
def test_dense_stats_from_refuses_what_holds_no_statistics(tmp_path, capsys, case):
    src = _csv(tmp_path)
    convert("csv", src, tmp_path / "plain", {"dense_columns": ["x"]}, max_malformed=0.1)
    cols = ["--dense-columns", "x", "--max-malformed", "0.1", "--no-progress"]
    if case != "no-transform":
        cols += ["--dense-transform", "standardize"]
    stats_from = {"not-a-model": tmp_path, "not-standardized": tmp_path / "plain"}.get(case, tmp_path / "plain")
    assert convert_main(["--format", "csv", "--data", str(src), "--out", str(tmp_path / "out"), *cols,
                         "--dense-stats-from", str(stats_from)]) == 2
    err = capsys.readouterr().err
    assert {"no-transform": "gives the statistics of --dense-transform standardize",
            "not-a-model": "neither an export", "not-standardized": "was not standardized"}[case] in err
    assert not (tmp_path / "out").exists()


def test_a_model_trained_from_a_conversion_scores_raw_and_converted_data_alike(tmp_path, criteo):
    from hps.predict import Predictor

    convert("criteo", criteo, tmp_path / "tr", max_malformed=0.1)
    _train(tmp_path, "m", "--format", "parquet", "--data", str(tmp_path / "tr"))
    pred = Predictor(tmp_path / "m")
    assert pred.format == "criteo"  # the export names the source's format: raw data can be scored
    raw = pred.predict(criteo, max_malformed=0.1)
    conv = pred.predict(tmp_path / "tr", readers=2)
    for a, b in zip(raw, conv):
        np.testing.assert_array_equal(a, b)
    other = tmp_path / "other"
    convert("criteo", criteo, other, {"int_as_categorical": True}, max_malformed=0.1)
    with pytest.raises(InvalidInputError, match="the keys would not match"):
        pred.predict(other)
