"""Inputs: files, directories, globs, .gz / .zst, the CSV column flags, Parquet; every format's shards
give exactly the examples of the whole data."""

import gzip

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from hps.data import Batch, DataFileNotFoundError, MISSING_VALUE, expand_paths, make_keys, open_dataset
from hps.data._parse_kernels import _fnv1a
from hps.errors import InvalidInputError


def _all(ds) -> Batch:
    return Batch.concat(list(ds.batches()))


def _criteo_lines(rng, n):
    lines = []
    for _ in range(n):
        ints = [str(x) if x >= 0 else "" for x in rng.integers(-1, 50, 13)]
        cats = [f"{x:08x}" for x in rng.integers(0, 2**32, 26)]
        lines.append("\t".join([str(rng.integers(0, 2))] + ints + cats))
    return "\n".join(lines) + "\n"


def _write(path, text: str):
    data = text.encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    elif path.suffix == ".zst":
        path.write_bytes(zstandard.ZstdCompressor().compress(data))
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_reads_like_plain(tmp_path, suffix):
    text = _criteo_lines(np.random.default_rng(0), 300)
    plain = open_dataset(_write(tmp_path / "a.txt", text), "criteo", 64)
    packed = open_dataset(_write(tmp_path / f"a.txt{suffix}", text), "criteo", 64, chunk_bytes=1000)
    a, b = _all(plain), _all(packed)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.dense, b.dense)
    assert packed.stats.bytes == len(text.encode())  # decompressed bytes parsed


def test_compressed_csv_header_and_libsvm(tmp_path):
    csv = "id,click,a,b\n" + "".join(f"{i},{i % 2},x{i % 7},y{i % 3}\n" for i in range(50))
    a = _all(open_dataset(_write(tmp_path / "p.csv", csv), "csv", 16, ignore_columns=["id"]))
    b = _all(open_dataset(_write(tmp_path / "p.csv.zst", csv), "csv", 16, ignore_columns=["id"]))
    np.testing.assert_array_equal(a.keys, b.keys)
    lib = "".join(f"{i % 2} {i}:1 {i + 100}:0.5\n" for i in range(40))
    r = open_dataset(_write(tmp_path / "l.svm.gz", lib), "libsvm", 16)
    assert r.n_fields == 2 and len(_all(r)) == 40


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_multi_member_files(tmp_path, suffix):
    """Concatenated gzip members / zstandard frames (what `cat a.gz b.gz` makes) read as one stream."""
    text = _criteo_lines(np.random.default_rng(4), 200)
    half = text.index("\n", len(text) // 2) + 1
    one = _write(tmp_path / f"x{suffix}", text[:half]).read_bytes()
    two = _write(tmp_path / f"y{suffix}", text[half:]).read_bytes()
    (tmp_path / f"both.txt{suffix}").write_bytes(one + two)
    plain = _all(open_dataset(_write(tmp_path / "both.txt", text), "criteo", 64))
    np.testing.assert_array_equal(_all(open_dataset(tmp_path / f"both.txt{suffix}", "criteo", 64)).keys, plain.keys)


def test_not_really_compressed(tmp_path):
    _write(tmp_path / "a.txt", _criteo_lines(np.random.default_rng(0), 3))
    (tmp_path / "a.txt").rename(tmp_path / "b.gz")
    with pytest.raises(InvalidInputError, match="not gzip data"):
        list(open_dataset(tmp_path / "b.gz", "criteo", 8).batches())


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_truncated_compressed_file_is_one_clear_error(tmp_path, suffix):
    p = _write(tmp_path / f"a.txt{suffix}", _criteo_lines(np.random.default_rng(0), 2000))
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(InvalidInputError, match=f"a.txt{suffix}: damaged or truncated"):
        list(open_dataset(p, "criteo", 64).batches())


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_damaged_compressed_file_is_one_clear_error(tmp_path, suffix):
    """Bytes changed inside the compressed stream: the codecs raise their own errors (isal's IsalError,
    zlib.error, zstandard's ZstdError), which must come out typed and naming the file."""
    text = _criteo_lines(np.random.default_rng(0), 2000)
    p = _write(tmp_path / f"a.txt{suffix}", text)
    if suffix == ".zst":   # with its checksum, as the zstd tool writes by default
        p.write_bytes(zstandard.ZstdCompressor(write_checksum=True).compress(text.encode()))
    data = bytearray(p.read_bytes())
    data[40:80] = bytes(b ^ 0x5A for b in data[40:80])
    p.write_bytes(bytes(data))
    with pytest.raises(InvalidInputError, match=f"a.txt{suffix}: damaged"):
        list(open_dataset(p, "criteo", 64).batches())


def test_a_zstandard_file_may_start_with_a_skippable_frame(tmp_path):
    """pzstd writes a skippable frame (magic 0x184D2A50) first: the file is read, not refused."""
    text = _criteo_lines(np.random.default_rng(2), 30)
    skippable = bytes([0x50, 0x2A, 0x4D, 0x18]) + (4).to_bytes(4, "little") + b"\0\0\0\0"
    (tmp_path / "p.txt.zst").write_bytes(skippable + zstandard.ZstdCompressor().compress(text.encode()))
    _write(tmp_path / "plain.txt", text)
    assert _all(open_dataset(tmp_path / "p.txt.zst", "criteo", 8)).keys.tolist() == \
        _all(open_dataset(tmp_path / "plain.txt", "criteo", 8)).keys.tolist()


def test_an_empty_data_path_is_refused_not_read_as_the_working_directory(tmp_path, monkeypatch):
    _write(tmp_path / "a.txt", _criteo_lines(np.random.default_rng(3), 5))
    monkeypatch.chdir(tmp_path)   # a directory holding data: "" must not read it
    for empty in ("", " ", ["", "a.txt"]):
        with pytest.raises(InvalidInputError, match="an empty data path"):
            expand_paths(empty)


def test_files_dirs_globs_and_errors(tmp_path):
    rng = np.random.default_rng(1)
    d = tmp_path / "d"
    d.mkdir()
    for i, suf in enumerate([".txt", ".txt.gz", ".txt.zst"]):
        _write(d / f"part{i}{suf}", _criteo_lines(rng, 20 + i))
    (d / ".hidden").write_text("junk\n")
    assert [p.name for p in expand_paths(d)] == ["part0.txt", "part1.txt.gz", "part2.txt.zst"]
    assert len(expand_paths(str(d / "part*"))) == 3
    assert len(expand_paths([d / "part0.txt", str(d / "part[12]*")])) == 3
    assert len(_all(open_dataset(d, "criteo", 16))) == 63
    with pytest.raises(DataFileNotFoundError, match="no data file matches"):
        expand_paths(str(tmp_path / "nothing*.gz"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataFileNotFoundError, match="holds no data file"):
        expand_paths(tmp_path / "empty")
    with pytest.raises(DataFileNotFoundError, match="not found"):
        expand_paths([d / "part0.txt", d / "missing.txt"])


@pytest.mark.parametrize("n_files,k", [(1, 3), (2, 3), (4, 3), (3, 2)])
def test_shards_of_mixed_compressed_files(tmp_path, n_files, k):
    """Shards read one after the other give every line once, in order; compressed files are whole."""
    rng = np.random.default_rng(n_files)
    sufs = [".txt", ".txt.gz", ".txt.zst", ".txt"]
    paths = [_write(tmp_path / f"f{i}{sufs[i]}", _criteo_lines(rng, 30 + 7 * i)) for i in range(n_files)]
    whole = _all(open_dataset(paths, "criteo", 1000))
    parts = [list(open_dataset(paths, "criteo", 1000, shard=(s, k)).batches()) for s in range(k)]
    joined = Batch.concat([b for p in parts for b in p])
    np.testing.assert_array_equal(joined.keys, whole.keys)
    np.testing.assert_array_equal(joined.labels, whole.labels)


def test_csv_column_choice(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("id,y,site,app,price\n1,1,s1,a1,2.5\n2,0,s2,,7\n")
    r = open_dataset(p, "csv", 8, label="y", ignore_columns=["id"], dense_columns=["price"])
    assert r.categorical_columns == ["site", "app"] and r.n_dense == 1
    b = _all(r)
    np.testing.assert_array_equal(b.dense[:, 0], [2.5, 7.0])
    # explicit categoricals, in the order given: field 0 is app; the other columns are ignored
    r2 = open_dataset(p, "csv", 8, label="y", categorical_columns=["app", "site"])
    assert r2.categorical_columns == ["app", "site"] and r2.n_dense == 0
    b2 = _all(r2)
    assert b2.keys[0] == make_keys(np.array([0]), np.array([_fnv1a(np.frombuffer(b"a1", np.uint8), 0, 2)],
                                                           np.uint64))[0]
    assert b2.keys[2] == make_keys(np.array([0]), np.array([MISSING_VALUE], np.uint64))[0]
    with pytest.raises(InvalidInputError, match=r"ignore column\(s\) \['nope'\] not in"):
        open_dataset(p, "csv", 8, label="y", ignore_columns=["nope"])
    with pytest.raises(InvalidInputError, match="given as dense and as categorical"):
        open_dataset(p, "csv", 8, label="y", dense_columns=["price"], categorical_columns=["price"])
    unlabelled = _all(open_dataset(p, "csv", 8, label=None, ignore_columns=["id", "y"]))
    np.testing.assert_array_equal(unlabelled.labels, [0, 0])


def _parquet_table(rng, n):
    return pa.table({
        "id": np.arange(n),
        "click": rng.integers(0, 2, n),
        "site": pa.array([f"s{x}" for x in rng.integers(0, 30, n)]).dictionary_encode(),
        "hour": rng.integers(0, 24, n),
        "price": rng.random(n) * 10,
        "app": pa.array([None if x == 0 else f"a{x}" for x in rng.integers(0, 5, n)]),
    })


def test_parquet_same_keys_as_csv(tmp_path):
    t = _parquet_table(np.random.default_rng(2), 500)
    pq.write_table(t, tmp_path / "t.parquet", row_group_size=64)
    df = t.to_pydict()
    lines = ["id,click,site,hour,price,app"] + [
        f"{df['id'][i]},{df['click'][i]},{df['site'][i]},{df['hour'][i]},{df['price'][i]!r},{df['app'][i] or ''}"
        for i in range(500)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    opts = dict(ignore_columns=["id"], dense_columns=["price"])
    a = _all(open_dataset(tmp_path / "t.csv", "csv", 100, **opts))
    r = open_dataset(tmp_path / "t.parquet", "parquet", 100, chunk_bytes=256 * 50, **opts)
    b = _all(r)
    assert r.categorical_columns == ["site", "hour", "app"] and r.rows == 500
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_allclose(a.dense, b.dense, rtol=1e-6)
    assert [len(x) for x in r.batches(start_batch=3)] == [100, 100]


@pytest.mark.parametrize("k", [1, 2, 3, 7])
def test_parquet_shards(tmp_path, k):
    rng = np.random.default_rng(3)
    paths = []
    for i, n in enumerate([130, 0, 77]):
        paths.append(tmp_path / f"p{i}.parquet")
        pq.write_table(_parquet_table(rng, n), paths[-1], row_group_size=40)
    whole = _all(open_dataset(paths, "parquet", 1000))
    assert len(whole) == 207
    parts = [b for s in range(k) for b in open_dataset(paths, "parquet", 1000, shard=(s, k)).batches()]
    np.testing.assert_array_equal(Batch.concat(parts).keys, whole.keys)


def test_parquet_boolean_dense_column_with_nulls_reads_them_as_zero(tmp_path):
    t = pa.table({"click": [1, 0, 1], "x": ["a", "b", "c"], "v": pa.array([True, None, False])})
    pq.write_table(t, tmp_path / "b.parquet")
    got = _all(open_dataset(tmp_path / "b.parquet", "parquet", 8, dense_columns=["v"]))
    assert got.dense[:, 0].tolist() == [1.0, 0.0, 0.0]


def test_parquet_nested_categorical_and_damaged_pages_are_clear_errors(tmp_path):
    t = pa.table({"click": [1, 0], "x": pa.array([[1, 2], [3]]), "y": ["a", "b"]})
    pq.write_table(t, tmp_path / "n.parquet")
    with pytest.raises(InvalidInputError, match=r"column 'x' is list<.*--ignore-columns"):
        open_dataset(tmp_path / "n.parquet", "parquet", 8)
    assert len(_all(open_dataset(tmp_path / "n.parquet", "parquet", 8, ignore_columns=["x"]))) == 2
    big = pa.table({"click": np.arange(20000) % 2, "x": [f"v{i}" for i in range(20000)]})
    pq.write_table(big, tmp_path / "c.parquet", compression="snappy")
    data = bytearray((tmp_path / "c.parquet").read_bytes())
    data[200:2000] = b"\xff" * 1800    # inside the first column chunk's pages; the footer intact
    (tmp_path / "c.parquet").write_bytes(bytes(data))
    with pytest.raises(InvalidInputError, match="c.parquet cannot be read"):
        list(open_dataset(tmp_path / "c.parquet", "parquet", 8).batches())


def test_parquet_malformed_and_errors(tmp_path):
    t = pa.table({"click": [1, 2, 0, None], "x": ["a", "b", "c", "d"], "d": [1.0, 2.0, float("inf"), 0.0]})
    pq.write_table(t, tmp_path / "bad.parquet")
    r = open_dataset(tmp_path / "bad.parquet", "parquet", 8, dense_columns=["d"], max_malformed=1.0)
    assert len(_all(r)) == 1 and r.stats.malformed == 3
    assert r.stats.first_malformed()[0].endswith("bad.parquet:2: unparseable label")
    assert "out-of-range number" in r.stats.first_malformed()[1]
    with pytest.raises(InvalidInputError, match=":2: malformed row"):
        list(open_dataset(tmp_path / "bad.parquet", "parquet", 8, strict=True).batches())
    with pytest.raises(InvalidInputError, match="must be numeric"):
        open_dataset(tmp_path / "bad.parquet", "parquet", 8, dense_columns=["x"])
    with pytest.raises(InvalidInputError, match=r"label column\(s\) \['y'\] not in"):
        open_dataset(tmp_path / "bad.parquet", "parquet", 8, label="y")
    (tmp_path / "no.parquet").write_text("click,x\n1,a\n")
    with pytest.raises(InvalidInputError, match="not a Parquet file"):
        open_dataset(tmp_path / "no.parquet", "parquet", 8)
