"""Parallel readers: N threads give the same batches, counts, reports and errors as one, for every format."""

import gzip
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hps.data import open_dataset
from hps.data._parallel import ordered_map
from hps.errors import InvalidInputError
from tests.test_data_criteo import _assert_same, _random_lines

READERS = (1, 2, 3)


def _criteo(tmp_path, n=900, bad_rate=0.03, seed=0):
    lines = _random_lines(np.random.default_rng(seed), n, bad_rate=bad_rate)
    lines[5] = ""  # a blank line
    p = tmp_path / "d.txt"
    p.write_text("\n".join(lines) + "\n")
    return p


def _libsvm(tmp_path, n=900):
    rng = np.random.default_rng(1)
    lines = [f"{rng.choice(['1', '-1', '0'])} " + " ".join(f"{rng.integers(0, 500)}:{rng.random():.3f}"
                                                          for _ in range(rng.integers(1, 6))) for _ in range(n)]
    lines[17] = "2 1:1"  # malformed label
    p = tmp_path / "d.libsvm"
    p.write_text("\n".join(lines) + "\n")
    return p


def _csv_rows(n, seed=2):
    rng = np.random.default_rng(seed)
    return {"click": rng.integers(0, 2, n), "a": rng.integers(0, 50, n).astype(str),
            "b": np.char.mod("%x", rng.integers(0, 9999, n)), "x": rng.random(n).round(3)}


def _csv(tmp_path, n=900):
    t = _csv_rows(n)
    lines = ["click,a,b,x"] + [f"{c},{a},{b},{x}" for c, a, b, x in zip(t["click"], t["a"], t["b"], t["x"])]
    lines[30] = "7,a,b,1"  # malformed label
    p = tmp_path / "d.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def _parquet(tmp_path, n=900):
    t = _csv_rows(n)
    t["click"][40] = 5  # malformed label
    p = tmp_path / "d.parquet"
    pq.write_table(pa.table(t), p, row_group_size=97)
    return p


#: format -> (make the file(s), open_dataset options, chunk_bytes giving many chunks)
FORMATS = {
    "criteo": (_criteo, {"max_malformed": 0.1}, 2048),
    "criteo-gz": (None, {"max_malformed": 0.1}, 2048),
    "libsvm": (_libsvm, {"max_malformed": 0.1}, 1024),
    "csv": (_csv, {"max_malformed": 0.1, "dense_columns": ["x"]}, 1024),
    "parquet": (_parquet, {"max_malformed": 0.1, "dense_columns": ["x"]}, 256 * 50),
}


def _path(tmp_path, fmt):
    if fmt == "criteo-gz":  # three compressed files (a compressed file is never cut: whole files per shard)
        lines = _criteo(tmp_path).read_text().splitlines(keepends=True)
        d = tmp_path / "gz"
        d.mkdir()
        for i in range(3):
            (d / f"part{i}.txt.gz").write_bytes(gzip.compress("".join(lines[i * 300:(i + 1) * 300]).encode()))
        return d
    return FORMATS[fmt][0](tmp_path)


def _read(path, fmt, readers, shard=(0, 1), batch_size=64, start_batch=0, **opts):
    ds = open_dataset(path, fmt.split("-")[0], batch_size, shard=shard, readers=readers, **opts)
    return list(ds.batches(start_batch)), ds.stats


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("shard", [(0, 1), (1, 3)])
def test_every_format_gives_the_same_batches_and_counts_with_any_readers(tmp_path, fmt, shard):
    path = _path(tmp_path, fmt)
    _, opts, chunk = FORMATS[fmt]
    one, st1 = _read(path, fmt, 1, shard, chunk_bytes=chunk, **opts)
    assert len(one) > 3
    if shard == (0, 1):
        assert st1.malformed > 0 and st1.malformed_at  # the reports are part of what must match
    for n in READERS[1:]:
        many, st = _read(path, fmt, n, shard, chunk_bytes=chunk, **opts)
        assert len(many) == len(one)
        for a, b in zip(one, many):
            _assert_same(a, b)
        assert st == st1  # lines, examples, blank, malformed, the first reported lines, bytes
        resumed, _ = _read(path, fmt, n, shard, start_batch=3, chunk_bytes=chunk, **opts)
        for a, b in zip(one[3:], resumed):
            _assert_same(a, b)


@pytest.mark.parametrize("shard", [(0, 1), (2, 3)])
def test_synthetic_gives_the_same_batches_with_any_readers(shard):
    kw = dict(rows=3000, fields=4, vocab_per_field=5000, block_rows=700)
    one, _ = _read(None, "synthetic", 1, shard, batch_size=256, **kw)
    for n in READERS[1:]:
        many, st = _read(None, "synthetic", n, shard, batch_size=256, **kw)
        assert len(many) == len(one) and st.examples == sum(len(b) for b in one)
        for a, b in zip(one, many):
            _assert_same(a, b)


@pytest.mark.parametrize("strict", [False, True])
def test_a_pass_stops_at_the_same_place_and_with_the_same_error(tmp_path, strict):
    lines = _random_lines(np.random.default_rng(4), 3000)
    for i in range(2000, 3000, 4):  # a quarter of the later lines malformed: the mid-pass check stops it
        lines[i] = "x" + lines[i]
    p = tmp_path / "d.txt"
    p.write_text("\n".join(lines) + "\n")
    outcomes, first = [], None
    for n in READERS:
        ds = open_dataset(p, "criteo", 100, readers=n, chunk_bytes=4096, strict=strict, max_malformed=0.01)
        got = []
        with pytest.raises(InvalidInputError) as e:
            for b in ds.batches():
                got.append(b)
        outcomes.append((len(got), str(e.value), ds.stats))
        first = first or got
        for a, b in zip(first, got):
            _assert_same(a, b)
    assert outcomes[0][0] > 0
    assert all(o == outcomes[0] for o in outcomes)


def test_a_failing_worker_stops_the_pass_with_its_error(tmp_path, monkeypatch):
    p = _criteo(tmp_path, n=2000, bad_rate=0)
    ds = open_dataset(p, "criteo", 64, readers=3, chunk_bytes=2048, max_malformed=0.1)
    work, calls = ds._work, []

    def failing(unit):
        calls.append(threading.current_thread().name)
        if unit.first_line > 1000:
            raise RuntimeError("disk on fire")
        return work(unit)

    monkeypatch.setattr(ds, "_work", failing)
    got = []
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="disk on fire"):
        for b in ds.batches():
            got.append(b)
    assert time.monotonic() - t0 < 30
    assert any(name.startswith("hps-reader") for name in calls)  # the work ran in the readers' threads
    one = list(open_dataset(p, "criteo", 64, chunk_bytes=2048, max_malformed=0.1).batches())
    assert 0 < len(got) < len(one)  # the batches before the failing chunk, and not one more
    for a, b in zip(got, one):
        _assert_same(a, b)
    assert not [t for t in threading.enumerate() if t.name.startswith("hps-reader")]


def test_ordered_map_keeps_the_order_and_stops_its_threads():
    def slow_square(x):
        time.sleep(0.002 * (7 - x % 7))  # later units finish first
        return x * x

    assert list(ordered_map(slow_square, range(40), 3)) == [x * x for x in range(40)]
    it = ordered_map(slow_square, range(1000), 4)
    assert next(it) == 0
    it.close()  # abandoned: no thread keeps running, nothing more is produced
    assert not [t for t in threading.enumerate() if t.name.startswith("hps-reader")]


def test_the_producers_failure_comes_after_the_units_it_made(tmp_path):
    """The units' producer failing (a file cut short, found while cutting the next unit) is raised in its
    turn: with several readers the units before it are delivered (and their errors raised) first."""
    def units():
        yield from range(6)
        raise InvalidInputError("the file ends early")

    def work(u):
        if u == 4:
            raise InvalidInputError("unit 4 is malformed")
        return u

    for readers in (1, 2, 4):
        got = []
        with pytest.raises(InvalidInputError, match="unit 4 is malformed"):
            for r in ordered_map(work, units(), readers):
                got.append(r)
        assert got == [0, 1, 2, 3]
    assert list(ordered_map(lambda u: u, range(3), 3)) == [0, 1, 2]
    with pytest.raises(InvalidInputError, match="ends early"):
        list(ordered_map(lambda u: u, units(), 3))


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_reader_counts_are_refused(tmp_path, bad):
    with pytest.raises(InvalidInputError, match="readers"):
        open_dataset(_criteo(tmp_path, n=10, bad_rate=0), "criteo", 4, readers=bad)
