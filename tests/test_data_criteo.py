"""Criteo TSV reader: hand-written lines with known keys, malformed lines, chunk boundaries, shards."""

import math

import numpy as np
import pytest

from hps.data import MISSING_VALUE, NEGATIVE_VALUE, Batch, CriteoReader, DataFileNotFoundError, make_keys
from hps.errors import InvalidInputError


def _line(label, ints, cats):
    return "\t".join([str(label)] + ["" if v is None else str(v) for v in ints]
                     + ["" if c is None else c for c in cats])


def _reference(lines, int_as_cat=False):
    """Slow per-line parser: (labels, dense, per-example keys, malformed line numbers)."""
    labels, dense, keys, bad = [], [], [], []
    for no, line in enumerate(lines, 1):
        line = line.rstrip("\r")
        if not line:
            continue
        cols = line.split("\t")
        try:
            assert len(cols) == 40 and cols[0] in ("0", "1")
            ints = [None if c == "" else int(c) for c in cols[1:14]]
            assert all(c == "" or (len(c) <= 8 and int(c, 16) >= 0 and c.isalnum()) for c in cols[14:])
            cats = [MISSING_VALUE if c == "" else int(c, 16) for c in cols[14:]]
        except (AssertionError, ValueError):
            bad.append(no)
            continue
        labels.append(float(cols[0]))
        dense.append([0.0 if v is None else math.log1p(max(v, 0)) for v in ints])
        vals = cats
        if int_as_cat:
            vals = cats + [MISSING_VALUE if v is None else NEGATIVE_VALUE if v < 0
                           else int(math.floor(math.log2(1 + v))) for v in ints]
        keys.append(make_keys(np.arange(len(vals)), np.array(vals, dtype=np.uint64)))
    return np.array(labels), np.array(dense).reshape(-1, 13), keys, bad


def _random_lines(rng, n, bad_rate=0.0):
    lines = []
    for _ in range(n):
        ints = [None if rng.random() < 0.2 else int(rng.integers(-3, 10**6)) for _ in range(13)]
        cats = [None if rng.random() < 0.1 else f"{int(rng.integers(0, 2**32)):08x}" for _ in range(26)]
        line = _line(int(rng.integers(0, 2)), ints, cats)
        if rng.random() < bad_rate:
            kind = rng.integers(0, 4)
            line = (line + "\textra" if kind == 0 else "x" + line if kind == 1
                    else line.replace("\t", "\tzz", 1) if kind == 2 else line[: line.rfind("\t")])
        lines.append(line)
    return lines


def _write(tmp_path, lines, name="d.txt", eol="\n"):
    p = tmp_path / name
    p.write_bytes(eol.join(lines).encode() + eol.encode())
    return p


def _all(reader, **kw):
    return Batch.concat(list(reader.batches(**kw)))


def _assert_same(a, b):
    for f in ("labels", "dense", "keys", "field", "weights", "offsets"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


def test_known_keys_and_dense(tmp_path):
    cats = [f"{i:08x}" for i in range(26)]
    cats[3] = None
    ints = [1, None, 0, -2] + [7] * 9
    p = _write(tmp_path, [_line(1, ints, cats), _line(0, [None] * 13, [None] * 26)])
    r = CriteoReader(p, batch_size=10)
    (b,) = list(r.batches())
    assert (r.n_fields, r.n_dense) == (26, 13)
    np.testing.assert_array_equal(b.labels, [1, 0])
    np.testing.assert_allclose(b.dense[0, :4], [math.log1p(1), 0, 0, 0])
    np.testing.assert_allclose(b.dense[0, 4], math.log1p(7), rtol=1e-6)
    assert not b.dense[1].any()
    vals = np.array([i if i != 3 else MISSING_VALUE for i in range(26)], dtype=np.uint64)
    np.testing.assert_array_equal(b.keys[:26], make_keys(np.arange(26), vals))
    np.testing.assert_array_equal(b.keys[26:], make_keys(np.arange(26), np.full(26, MISSING_VALUE)))
    np.testing.assert_array_equal(b.offsets, [0, 26, 52])
    np.testing.assert_array_equal(b.field, np.tile(np.arange(26), 2))
    assert (b.weights == 1).all()
    assert (b.keys >> np.uint64(48)).max() == 25


def test_int_as_categorical(tmp_path):
    ints = [0, 1, 2, 3, 1023, 1024, None, -1] + [5] * 5
    p = _write(tmp_path, [_line(0, ints, ["0"] * 26)])
    r = CriteoReader(p, batch_size=4, int_as_categorical=True)
    (b,) = list(r.batches())
    assert r.n_fields == 39 and len(b.keys) == 39
    want = [0, 1, 1, 2, 10, 10, MISSING_VALUE, NEGATIVE_VALUE] + [2] * 5
    np.testing.assert_array_equal(b.keys[26:], make_keys(np.arange(26, 39), np.array(want, np.uint64)))


def test_matches_reference_with_crlf_and_malformed(tmp_path):
    rng = np.random.default_rng(1)
    lines = _random_lines(rng, 400, bad_rate=0.1)
    for cat in (False, True):
        labels, dense, keys, bad = _reference(lines, cat)
        for eol in ("\n", "\r\n"):
            r = CriteoReader(_write(tmp_path, lines, eol=eol), batch_size=64, int_as_categorical=cat,
                             max_malformed=1.0)
            b = _all(r)
            np.testing.assert_array_equal(b.labels, labels)
            np.testing.assert_allclose(b.dense, dense, rtol=1e-6)
            np.testing.assert_array_equal(b.keys, np.concatenate(keys))
            assert r.stats.malformed == len(bad) > 0
            assert [ln for _, ln, _ in r.stats.malformed_at] == bad[:10]
            assert r.stats.examples == len(labels) and r.stats.lines == 400


def test_malformed_reasons_and_line_numbers(tmp_path):
    good = _line(1, [1] * 13, ["ab"] * 26)
    lines = [good, good + "\tx", good, "2" + good[1:], good.replace("ab", "xyz", 1),
             good.replace("\t1", "\t1.5", 1), "", good, good.replace("ab", "123456789", 1)]
    p = _write(tmp_path, lines)
    r = CriteoReader(p, batch_size=3, max_malformed=1.0)
    assert sum(len(b) for b in r.batches()) == 3
    assert r.stats.malformed == 5 and r.stats.blank == 1 and r.stats.lines == 9
    assert r.stats.malformed_at == [
        (str(p), 2, "wrong number of columns"), (str(p), 4, "unparseable label"),
        (str(p), 5, "categorical is not 1-8 hex digits"),
        (str(p), 6, "unparseable or out-of-range number"),
        (str(p), 9, "categorical is not 1-8 hex digits")]


def test_strict_raises_at_first_malformed_line(tmp_path):
    good = _line(0, [1] * 13, ["ab"] * 26)
    p = _write(tmp_path, [good] * 5 + ["junk"] + [good] * 3)
    r = CriteoReader(p, batch_size=2, strict=True)
    seen = []
    with pytest.raises(InvalidInputError, match=rf"{p.name}:6: .*unparseable label"):
        for b in r.batches():
            seen.append(len(b))
    assert seen == [2, 2]  # the batches before the bad line came through


def test_chunk_boundaries_do_not_change_batches(tmp_path):
    rng = np.random.default_rng(2)
    lines = _random_lines(rng, 300, bad_rate=0.05)
    p = tmp_path / "d.txt"
    p.write_bytes(("\n".join(lines)).encode())  # no newline at the end either
    ref_r = CriteoReader(p, batch_size=50, max_malformed=1.0)
    ref = list(ref_r.batches())
    for chunk in (1, 7, 333, 4096):
        r = CriteoReader(p, batch_size=50, chunk_bytes=chunk, max_malformed=1.0)
        got = list(r.batches())
        assert [len(b) for b in got] == [len(b) for b in ref]
        for a, b in zip(got, ref):
            _assert_same(a, b)
        assert r.stats == ref_r.stats


def test_batch_sizes_shards_and_resume(tmp_path):
    p = _write(tmp_path, _random_lines(np.random.default_rng(3), 230))
    full = list(CriteoReader(p, batch_size=50).batches())
    assert [len(b) for b in full] == [50, 50, 50, 50, 30]
    for n_shards in (2, 3, 7):
        shards = [b for r in range(n_shards) for b in CriteoReader(p, batch_size=50, shard=(r, n_shards)).batches()]
        _assert_same(Batch.concat(shards), Batch.concat(full))
    resumed = list(CriteoReader(p, batch_size=50).batches(start_batch=3))
    assert len(resumed) == 2
    _assert_same(resumed[0], full[3])


def test_multiple_files_run_across_file_ends(tmp_path):
    lines = _random_lines(np.random.default_rng(4), 120)
    a, b = _write(tmp_path, lines[:70], "a.txt"), _write(tmp_path, lines[70:], "b.txt")
    one = _all(CriteoReader(_write(tmp_path, lines, "all.txt"), batch_size=32))
    got = list(CriteoReader([a, b], batch_size=32).batches())
    assert [len(x) for x in got] == [32, 32, 32, 24]
    _assert_same(Batch.concat(got), one)


def test_bad_arguments(tmp_path):
    with pytest.raises(DataFileNotFoundError, match="not found"):
        CriteoReader(tmp_path / "nope.txt", batch_size=4)
    with pytest.raises(FileNotFoundError):
        CriteoReader(tmp_path / "nope.txt", batch_size=4)
    p = _write(tmp_path, ["x"])
    with pytest.raises(InvalidInputError, match="batch_size"):
        CriteoReader(p, batch_size=0)
    with pytest.raises(InvalidInputError, match="shard"):
        CriteoReader(p, batch_size=4, shard=(2, 2))


def test_empty_file_is_an_error(tmp_path):
    """A pass that finds no example at all raises (a job would otherwise train nothing and succeed)."""
    p = tmp_path / "e.txt"
    p.write_bytes(b"\n\n")
    r = CriteoReader(p, batch_size=4)
    with pytest.raises(InvalidInputError, match="no valid example in .*e.txt: no data lines; expected Criteo"):
        list(r.batches())
    assert r.stats.lines == 2 and r.stats.blank == 2
    with pytest.raises(InvalidInputError, match="no valid example"):
        r.probe()


def test_real_criteo_sample(shared_data):
    r = CriteoReader(shared_data / "criteo_sample" / "train-10k.txt", batch_size=4096)
    batches = list(r.batches())
    assert [len(b) for b in batches] == [4096, 4096, 1808]
    assert sum(int(b.labels.sum()) for b in batches) == 2182
    assert r.stats.examples == 10_000 and r.stats.malformed == 0
    assert r.stats.bytes == 2_422_799
    b = batches[0]
    assert b.dense.shape == (4096, 13) and len(b.keys) == 4096 * 26
    # First row: "0\t1\t1\t5\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b…"
    np.testing.assert_allclose(b.dense[0, :5], np.log1p([1, 1, 5, 0, 1382]), rtol=1e-6)
    assert b.dense[0, 11] == 0
    np.testing.assert_array_equal(
        b.keys[:2], make_keys(np.array([0, 1]), np.array([0x68FD1E64, 0x80E26C9B], np.uint64)))
