"""CSV reader (Avazu-style): header, named label, categorical hashing, dense columns, malformed lines."""

import numpy as np
import pytest

from hps.data import MISSING_VALUE, Batch, CsvReader, make_keys
from hps.errors import InvalidInputError


def _fnv1a(s: str) -> int:
    h = 0xCBF29CE484222325
    for byte in s.encode():
        h = ((h ^ byte) * 0x100000001B3) & (2**64 - 1)
    return h


def _write(tmp_path, text, name="d.csv"):
    p = tmp_path / name
    p.write_bytes(text.encode())
    return p


def _assert_same(a, b):
    for f in ("labels", "dense", "keys", "field", "weights", "offsets"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


TEXT = ("id,click,hour,site,price,device\r\n"
        "a1,0,14102100,abc,1.5,\r\n"
        "a2,1,14102101,def,,ios\r\n")


def test_known_keys(tmp_path):
    p = _write(tmp_path, TEXT)
    r = CsvReader(p, batch_size=4, dense_columns=["price"], ignore_columns=["id"])
    assert r.categorical_columns == ["hour", "site", "device"]
    assert (r.n_fields, r.n_dense) == (3, 1)
    (b,) = list(r.batches())
    np.testing.assert_array_equal(b.labels, [0, 1])
    np.testing.assert_array_equal(b.dense, [[1.5], [0.0]])
    vals = [_fnv1a("14102100"), _fnv1a("abc"), MISSING_VALUE,
            _fnv1a("14102101"), _fnv1a("def"), _fnv1a("ios")]
    np.testing.assert_array_equal(b.keys, make_keys(np.tile(np.arange(3), 2), np.array(vals, np.uint64)))
    assert r.stats.lines == 2 and r.stats.examples == 2


def test_default_label_and_all_columns_categorical(tmp_path):
    r = CsvReader(_write(tmp_path, TEXT), batch_size=4)
    assert r.categorical_columns == ["id", "hour", "site", "price", "device"] and r.n_dense == 0


def test_header_errors(tmp_path):
    p = _write(tmp_path, TEXT)
    with pytest.raises(InvalidInputError, match="label column"):
        CsvReader(p, batch_size=4, label="y")
    with pytest.raises(InvalidInputError, match="dense column"):
        CsvReader(p, batch_size=4, dense_columns=["nope"])
    with pytest.raises(InvalidInputError, match="header differs"):
        CsvReader([p, _write(tmp_path, "click,x\n1,2\n", "o.csv")], batch_size=4)
    with pytest.raises(InvalidInputError, match="missing CSV header"):
        CsvReader(_write(tmp_path, "", "e.csv"), batch_size=4)


def test_malformed_lines_line_numbers_and_strict(tmp_path):
    text = "click,a,x\n1,u,2\n1,u\n7,u,1\n0,u,zz\n1,u,1,extra\n0,v,3\n"
    p = _write(tmp_path, text)
    r = CsvReader(p, batch_size=4, dense_columns=["x"], max_malformed=1.0)
    (b,) = list(r.batches())
    np.testing.assert_array_equal(b.dense[:, 0], [2, 3])
    assert r.stats.malformed == 4
    assert r.stats.malformed_at == [
        (str(p), 3, "wrong number of columns"), (str(p), 4, "unparseable label"),
        (str(p), 5, "unparseable or out-of-range number"), (str(p), 6, "wrong number of columns")]
    with pytest.raises(InvalidInputError, match=r"d.csv:3: "):
        list(CsvReader(p, batch_size=4, dense_columns=["x"], strict=True).batches())


def test_chunks_shards_and_files(tmp_path):
    rng = np.random.default_rng(7)
    rows = [f"{int(rng.integers(0, 2))},{rng.choice(['a', 'bb', '', 'ccc'])},{rng.integers(0, 99)}"
            for _ in range(333)]
    text = "click,s,t\n" + "\n".join(rows) + "\n"
    p = _write(tmp_path, text)
    full = list(CsvReader(p, batch_size=40).batches())
    assert [len(b) for b in full] == [40] * 8 + [13]
    for chunk in (1, 5, 64):
        for a, b in zip(CsvReader(p, batch_size=40, chunk_bytes=chunk).batches(), full):
            _assert_same(a, b)
    shards = [b for r in range(3) for b in CsvReader(p, batch_size=40, shard=(r, 3)).batches()]
    _assert_same(Batch.concat(shards), Batch.concat(full))  # byte ranges: every line in one shard
    half = "click,s,t\n" + "\n".join(rows[:100]) + "\n", "click,s,t\n" + "\n".join(rows[100:]) + "\n"
    two = CsvReader([_write(tmp_path, half[0], "a.csv"), _write(tmp_path, half[1], "b.csv")],
                    batch_size=40)
    _assert_same(Batch.concat(list(two.batches())), Batch.concat(full))
