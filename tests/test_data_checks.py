"""What the readers refuse: too many malformed lines, data with no valid example, float32
overflow, field ids beyond MAX_FIELD."""

import numpy as np
import pytest

from hps.data import (MAX_FIELD, MAX_FIELDS, CriteoReader, CsvReader, LibsvmReader, SyntheticData,
                      make_keys)
from hps.data._chunks import MIN_LINES_FOR_FRACTION
from hps.errors import InvalidInputError


def _libsvm(tmp_path, lines, name="d.libsvm"):
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n")
    return p


def _good(i):
    return f"{i % 2} {i}:1 {i + 1}:0.5"


def test_max_malformed_stops_mid_pass(tmp_path):
    """~3 % bad lines after a clean start: the pass stops once MIN_LINES_FOR_FRACTION lines are read,
    long before the end of the file, naming the first bad line and the expected format."""
    n = 4 * MIN_LINES_FOR_FRACTION
    lines = [("7 1:1" if i >= 100 and i % 33 == 0 else _good(i)) for i in range(n)]
    p = _libsvm(tmp_path, lines)
    r = LibsvmReader(p, batch_size=256, n_fields=2, chunk_bytes=4096)
    with pytest.raises(InvalidInputError, match=r"malformed \([23]\.\d\d%, more than max_malformed 1\.00% "
                                                r"allows\) \(first: .*d.libsvm:133: unparseable label.*expected libsvm"):
        for _ in r.batches():
            pass
    assert MIN_LINES_FOR_FRACTION <= r.stats.lines < n
    # a looser threshold reads it all and counts every bad line
    r = LibsvmReader(p, batch_size=256, n_fields=2, chunk_bytes=4096, max_malformed=0.05)
    assert sum(len(b) for b in r.batches()) == n - r.stats.malformed
    assert r.stats.malformed == sum(1 for i in range(100, n) if i % 33 == 0)
    assert r.stats.first_malformed()[0] == f"{p}:133: unparseable label"


def test_threshold_is_checked_at_the_end_of_a_short_pass(tmp_path):
    lines = [_good(i) for i in range(98)] + ["x", "y"]
    p = _libsvm(tmp_path, lines)
    with pytest.raises(InvalidInputError, match="2 of the 100 lines"):
        list(LibsvmReader(p, batch_size=64, n_fields=2).batches())
    assert sum(len(b) for b in LibsvmReader(p, batch_size=64, n_fields=2, max_malformed=0.02).batches()) == 98
    with pytest.raises(InvalidInputError, match="max_malformed"):
        LibsvmReader(p, batch_size=64, max_malformed=1.5)


def test_probe_rejects_the_wrong_format(tmp_path):
    """A CSV file read as Criteo, or a label column that is not 0/1: no valid example, said at once."""
    csv = tmp_path / "t.csv"
    csv.write_text("click,a,b\n1,x,y\n0,z,w\n")
    r = CriteoReader(csv, batch_size=4)
    with pytest.raises(InvalidInputError, match=r"no valid example in .*t.csv: all 3 lines are malformed "
                                                r"\(first: .*t.csv:1: .*expected Criteo TSV"):
        r.probe()
    bad_label = tmp_path / "l.csv"
    bad_label.write_text("click,a,b\n2,x,y\nyes,z,w\n")
    with pytest.raises(InvalidInputError, match="all 2 lines are malformed .*l.csv:2: unparseable label"):
        CsvReader(bad_label, batch_size=4).probe()
    good = tmp_path / "g.csv"
    good.write_text("click,a,b\n1,x,y\n0,z,w\n")
    st = CsvReader(good, batch_size=4).probe()
    assert st.examples == 2 and st.malformed == 0


def test_a_directory_of_wrong_files_is_named_in_a_few_words(tmp_path):
    """A directory of many files in another format (``--data DIR``): the message names the first files and
    counts the rest (it listed every file), for each format that reads lines."""
    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_text("not,data\n" * 3)
    for reader in (CriteoReader(tmp_path, batch_size=4), LibsvmReader(tmp_path, batch_size=4, n_fields=2)):
        with pytest.raises(InvalidInputError) as e:
            reader.probe()
        msg = str(e.value)
        assert f"{tmp_path / 'f00.txt'}, {tmp_path / 'f01.txt'}, {tmp_path / 'f02.txt'} and 37 more files" in msg
        assert not any(f"f{i:02d}.txt" in msg for i in range(3, 40))
    with pytest.raises(InvalidInputError, match=r"no valid libsvm line in .*f02.txt and 37 more files; cannot infer"):
        LibsvmReader(tmp_path, batch_size=4)   # n_fields inferred from the first valid line: there is none


def test_float32_overflow_is_a_malformed_value(tmp_path):
    """1e39 is finite in float64 but inf in float32: the line is malformed, not a later NaN loss."""
    p = _libsvm(tmp_path, ["1 1:1e39", "0 1:-1e39", "1 1:3.4e38", "0 1:1e-39"])
    r = LibsvmReader(p, batch_size=8, n_fields=1, max_malformed=1.0)
    (b,) = list(r.batches())
    assert np.isfinite(b.weights).all() and b.weights[0] == np.float32(3.4e38)
    assert r.stats.malformed_at == [(str(p), 1, "unparseable or out-of-range number"),
                                    (str(p), 2, "unparseable or out-of-range number")]
    c = tmp_path / "d.csv"
    c.write_text("click,x,a\n1,1e39,u\n0,2.5,v\n")
    r = CsvReader(c, batch_size=8, dense_columns=["x"], max_malformed=1.0)
    (b,) = list(r.batches())
    assert b.dense[:, 0].tolist() == [2.5] and r.stats.malformed == 1


def test_max_field_is_enforced(tmp_path):
    """Field ids live in 16 bits of a key: beyond MAX_FIELD they would wrap into other fields."""
    assert MAX_FIELDS == MAX_FIELD + 1 == 65535
    values = np.arange(2, dtype=np.uint64)
    make_keys(np.array([0, MAX_FIELD]), values)
    for bad in (MAX_FIELD + 1, 1 << 16, -1):
        with pytest.raises(InvalidInputError, match="field ids must lie in"):
            make_keys(np.array([0, bad]), values)
    with pytest.raises(InvalidInputError, match="synthetic fields must be between 1 and 65535"):
        SyntheticData(rows=10, fields=MAX_FIELDS + 1)
    p = _libsvm(tmp_path, ["1 " + " ".join(f"{j}:1" for j in range(MAX_FIELDS + 1))])
    with pytest.raises(InvalidInputError, match="features on the first valid libsvm line"):
        LibsvmReader(p, batch_size=4)
    with pytest.raises(InvalidInputError, match="n_fields must be between 1 and 65535"):
        LibsvmReader(p, batch_size=4, n_fields=MAX_FIELDS + 1)
    c = tmp_path / "wide.csv"
    c.write_text("click," + ",".join(f"c{j}" for j in range(MAX_FIELDS + 1)) + "\n")
    with pytest.raises(InvalidInputError, match="categorical CSV columns must be between 0 and 65535"):
        CsvReader(c, batch_size=4)
