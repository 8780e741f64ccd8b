"""libsvm/libFM reader: labels, positional fields, CRLF, malformed lines, chunks, shards, Frappe."""

import numpy as np
import pytest

from hps.data import Batch, LibsvmReader, make_keys
from hps.errors import InvalidInputError


def _write(tmp_path, text, name="d.libsvm"):
    p = tmp_path / name
    p.write_bytes(text.encode())
    return p


def _all(reader, **kw):
    return Batch.concat(list(reader.batches(**kw)))


def _assert_same(a, b):
    for f in ("labels", "dense", "keys", "field", "weights", "offsets"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


def _reference(lines, n_fields):
    """Slow per-line parser: (labels, fields, idx, vals, offsets, malformed line numbers)."""
    labels, fields, idx, vals, offsets, bad = [], [], [], [], [0], []
    for no, line in enumerate(lines, 1):
        toks = line.rstrip("\r").split()
        if not toks:
            continue
        try:
            lab = float(toks[0])
            assert lab in (1.0, 0.0, -1.0)
            feats = [(int(t.split(":")[0]), float(t.split(":")[1])) for t in toks[1:]]
            assert all(len(t.split(":")) == 2 and t.split(":")[0].isdigit() for t in toks[1:])
        except (AssertionError, ValueError, IndexError):
            bad.append(no)
            continue
        labels.append(1.0 if lab == 1 else 0.0)
        for j, (i, v) in enumerate(feats):
            fields.append(min(j, n_fields - 1))
            idx.append(i)
            vals.append(v)
        offsets.append(len(idx))
    return labels, fields, idx, vals, offsets, bad


def test_known_keys_labels_and_fields(tmp_path):
    p = _write(tmp_path, "1 3:1 10:0.5 7:2\r\n-1 4:1 11:1\r\n0 5:1 12:1 8:1 9:-1.5e-1\r\n")
    r = LibsvmReader(p, batch_size=8)
    assert (r.n_fields, r.n_dense) == (3, 0)
    (b,) = list(r.batches())
    np.testing.assert_array_equal(b.labels, [1, 0, 0])
    np.testing.assert_array_equal(b.offsets, [0, 3, 5, 9])
    np.testing.assert_array_equal(b.field, [0, 1, 2, 0, 1, 0, 1, 2, 2])  # extra features -> last field
    np.testing.assert_array_equal(b.keys, make_keys(b.field, np.array([3, 10, 7, 4, 11, 5, 12, 8, 9],
                                                                      np.uint64)))
    np.testing.assert_allclose(b.weights, [1, 0.5, 2, 1, 1, 1, 1, 1, -0.15])
    assert b.dense.shape == (3, 0)


def test_n_fields_option_and_first_valid_line(tmp_path):
    p = _write(tmp_path, "bad line\n\n1 1:1 2:1\n0 1:1 2:1 3:1\n")
    assert LibsvmReader(p, batch_size=4).n_fields == 2
    r = LibsvmReader(p, batch_size=4, n_fields=5, max_malformed=1.0)
    b = _all(r)
    np.testing.assert_array_equal(b.field, [0, 1, 0, 1, 2])
    assert r.stats.malformed == 1 and r.stats.blank == 1
    with pytest.raises(InvalidInputError, match="n_fields"):
        LibsvmReader(p, batch_size=4, n_fields=0)
    with pytest.raises(InvalidInputError, match="no valid libsvm line"):
        LibsvmReader(_write(tmp_path, "x\n", "bad.libsvm"), batch_size=4)


def test_malformed_lines_and_strict(tmp_path):
    text = "1 1:1\n2 1:1\n1 1:x\n1 a:1\n1 11\n0 1:1\n1 1:nan\n1 1:1e999\n-1 3:1\n"
    p = _write(tmp_path, text)
    r = LibsvmReader(p, batch_size=4, max_malformed=1.0)
    b = _all(r)
    assert len(b) == 3 and r.stats.malformed == 6
    assert r.stats.malformed_at == [
        (str(p), 2, "unparseable label"), (str(p), 3, "unparseable or out-of-range number"),
        (str(p), 4, "feature is not idx:value"), (str(p), 5, "feature is not idx:value"),
        (str(p), 7, "unparseable or out-of-range number"),
        (str(p), 8, "unparseable or out-of-range number")]
    with pytest.raises(InvalidInputError, match=r"d.libsvm:2: malformed line \(unparseable label\)"):
        list(LibsvmReader(p, batch_size=4, strict=True).batches())


def _random_text(rng, n, eol):
    lines = []
    for _ in range(n):
        k = int(rng.integers(0, 8))
        feats = " ".join(f"{int(rng.integers(0, 10**6))}:{rng.choice(['1', '0.25', '-3', '2e-2'])}"
                         for _ in range(k))
        line = f"{rng.choice(['1', '-1', '0', '+1'])} {feats}".rstrip()
        u = rng.random()
        if u < 0.05:
            line = line.replace(":", "::", 1) if ":" in line else "7" + line
        elif u < 0.08:
            line = ""
        elif u < 0.12:
            line = line.replace(" ", "\t ")
        lines.append(line)
    return lines, eol.join(lines) + eol


def test_matches_reference_across_chunk_sizes(tmp_path):
    rng = np.random.default_rng(5)
    lines, text = _random_text(rng, 500, "\r\n")
    p = _write(tmp_path, text)
    labels, fields, idx, vals, offsets, bad = _reference(lines, 4)
    ref = None
    for chunk in (1, 13, 1000, 1 << 20):
        r = LibsvmReader(p, batch_size=37, n_fields=4, chunk_bytes=chunk, max_malformed=1.0)
        got = list(r.batches())
        assert all(len(x) == 37 for x in got[:-1])
        b = Batch.concat(got)
        np.testing.assert_array_equal(b.labels, labels)
        np.testing.assert_array_equal(b.offsets, offsets)
        np.testing.assert_array_equal(b.field, fields)
        np.testing.assert_array_equal(b.keys, make_keys(np.array(fields), np.array(idx, np.uint64)))
        np.testing.assert_allclose(b.weights, vals, rtol=1e-6)
        assert r.stats.malformed == len(bad) > 0
        assert [ln for _, ln, _ in r.stats.malformed_at] == bad[:10]
        if ref is None:
            ref = b
        _assert_same(b, ref)


def test_shards_concatenate_to_the_whole_file(tmp_path):
    _, text = _random_text(np.random.default_rng(6), 300, "\n")
    p = _write(tmp_path, text)
    full = list(LibsvmReader(p, batch_size=64, n_fields=4, max_malformed=1.0).batches())
    shards = [b for r in range(4)
              for b in LibsvmReader(p, batch_size=64, n_fields=4, shard=(r, 4), max_malformed=1.0).batches()]
    _assert_same(Batch.concat(shards), Batch.concat(full))


def test_real_frappe(shared_data):
    r = LibsvmReader(shared_data / "frappe" / "frappe.validation.libfm", batch_size=4096)
    assert r.n_fields == 10
    batches = list(r.batches())
    assert sum(len(b) for b in batches) == 57_722
    assert sum(int(b.labels.sum()) for b in batches) == 19_063
    assert r.stats.malformed == 0 and r.stats.bytes == 4_163_044
    b = batches[0]
    assert (np.diff(b.offsets) == 10).all() and (b.weights == 1).all()
    np.testing.assert_array_equal(b.field[:10], np.arange(10))
    # First line: "1 266:1 1244:1 5042:1 5049:1 5054:1 5055:1 5058:1 5062:1 5074:1 5149:1"
    np.testing.assert_array_equal(b.keys[:10], make_keys(np.arange(10), np.array(
        [266, 1244, 5042, 5049, 5054, 5055, 5058, 5062, 5074, 5149], np.uint64)))
    test = LibsvmReader(shared_data / "frappe" / "frappe.test.libfm", batch_size=10_000)
    assert sum(int(b.labels.sum()) for b in test.batches()) == 9_536
    assert test.stats.examples == 28_860
