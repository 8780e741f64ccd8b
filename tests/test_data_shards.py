"""Sharded reading: every line (or row) in exactly one shard, each shard parsing only its own bytes."""

import numpy as np
import pytest

from hps.data import Batch, CriteoReader, CsvReader, DataFileNotFoundError, LibsvmReader, SyntheticData, open_dataset
from hps.data._shards import Segment, plan_segments, share_bounds
from tests.test_data_criteo import _assert_same, _line, _random_lines


def _shards(make, k):
    """Batches of every shard (a list per shard) and the readers."""
    readers = [make((s, k)) for s in range(k)]
    return [list(r.batches()) for r in readers], readers


def _concat(batches):
    return Batch.concat(batches) if batches else None


def test_share_bounds_cover_everything_once():
    for n in (0, 1, 5, 17):
        for k in (1, 2, 3, 7):
            spans = [share_bounds(n, s, k) for s in range(k)]
            assert spans[0][0] == 0 and spans[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            assert max(b - a for a, b in spans) - min(b - a for a, b in spans) <= 1


def test_plan_whole_files_or_byte_ranges():
    paths = ["a", "b", "c", "d", "e"]
    sizes = [10, 20, 30, 40, 50]
    starts = [0] * 5
    assert [s.path for s in plan_segments(paths, starts, sizes, 0, 2)] == ["a", "b", "c"]
    assert [s.path for s in plan_segments(paths, starts, sizes, 1, 2)] == ["d", "e"]
    assert plan_segments(paths, starts, sizes, 1, 5) == [Segment("b", 0, 20, 0)]
    # two files of 100 data bytes after 10-byte headers, 3 shards: ranges run across the file end
    segs = [plan_segments(["x", "y"], [10, 10], [110, 110], s, 3) for s in range(3)]
    assert segs[0] == [Segment("x", 10, 76, 10)]
    assert segs[1] == [Segment("x", 76, 110, 10), Segment("y", 10, 43, 10)]
    assert segs[2] == [Segment("y", 43, 110, 10)]


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_every_line_in_exactly_one_shard(tmp_path, k, chunk):
    rng = np.random.default_rng(k)
    lines = _random_lines(rng, 157, bad_rate=0.05)
    lines[40] = lines[40] + "\t" * 3000  # a very long (malformed) line spans several shards' ranges
    p = tmp_path / "d.txt"
    p.write_bytes(("\r\n".join(lines)).encode())  # CRLF, and no newline at the end
    full = CriteoReader(p, batch_size=16, max_malformed=1.0)
    whole = _concat(list(full.batches()))
    shards, readers = _shards(lambda sh: CriteoReader(p, batch_size=16, shard=sh, chunk_bytes=chunk,
                                                      max_malformed=1.0), k)
    _assert_same(_concat([b for s in shards for b in s]), whole)
    assert sum(r.stats.lines for r in readers) == full.stats.lines == len(lines)
    assert sum(r.stats.malformed for r in readers) == full.stats.malformed
    # a shard parses about its byte range: never more than its range plus the line that crosses its end
    size = p.stat().st_size
    assert sum(r.stats.bytes for r in readers) == full.stats.bytes
    longest = max(len(x) for x in lines) + 3
    spans = [sum(seg.stop - seg.start for seg in r.segments()) for r in readers]
    assert sum(spans) == size
    for span, r in zip(spans, readers):
        assert r.stats.bytes <= span + longest


@pytest.mark.parametrize("k", [2, 4, 5])
def test_byte_ranges_hold_about_as_many_lines(tmp_path, k):
    """A file whose first half has short lines (empty fields) and second half long ones: byte ranges of
    equal length would give shard 0 several times the lines (the examples, so the work) of the others;
    the cuts follow the lines instead. A file of 2 MiB, so the line counts are sampled, not counted."""
    rng = np.random.default_rng(7)
    short = [_line(1, [None] * 13, [f"{v:08x}" for v in rng.integers(0, 99, 4)] + [None] * 22)
             for _ in range(12_000)]
    long_ = _random_lines(rng, 6_000)
    p = tmp_path / "uneven.txt"
    p.write_text("\n".join(short + long_) + "\n")
    assert p.stat().st_size > 64 * (1 << 14)
    shards, readers = _shards(lambda sh: CriteoReader(p, batch_size=512, shard=sh, max_malformed=1.0), k)
    counts = [r.stats.lines for r in readers]
    assert sum(counts) == 18_000
    assert max(counts) <= 1.1 * 18_000 / k and min(counts) >= 0.9 * 18_000 / k, counts  # byte ranges: 2-3x
    whole = _concat(list(CriteoReader(p, batch_size=512, max_malformed=1.0).batches()))
    _assert_same(_concat([b for s in shards for b in s]), whole)


def test_malformed_lines_of_a_later_shard_name_their_byte_offset(tmp_path):
    lines = _random_lines(np.random.default_rng(2), 60)
    lines[50] = "x" + lines[50]
    p = tmp_path / "d.txt"
    p.write_bytes(("\n".join(lines) + "\n").encode())
    r = CriteoReader(p, batch_size=8, shard=(1, 2), max_malformed=1.0)
    list(r.batches())
    (where, line, _), = r.stats.malformed_at
    start = (p.stat().st_size // 2)
    begin = p.read_bytes().index(b"\n", start - 1) + 1
    assert where == f"{p} (lines counted from byte {begin})"
    assert p.read_bytes()[begin:].split(b"\n")[line - 1].startswith(b"x")
    r0 = CriteoReader(p, batch_size=8, strict=True, shard=(0, 1))
    with pytest.raises(Exception, match=f"{p}:51: malformed"):
        list(r0.batches())


def test_many_files_go_whole_to_shards_and_few_files_are_cut(tmp_path):
    rng = np.random.default_rng(5)
    files = []
    for i in range(5):
        f = tmp_path / "data" / f"part-{i}.txt"
        f.parent.mkdir(exist_ok=True)
        f.write_text("\n".join(_random_lines(rng, 20 + 7 * i)) + "\n")
        files.append(f)
    (tmp_path / "data" / ".hidden").write_text("not data\n")
    whole = _concat(list(CriteoReader(files, batch_size=32).batches()))
    for data in (tmp_path / "data", str(tmp_path / "data" / "part-*.txt")):  # a directory, a glob
        for k in (2, 5, 7):
            shards, readers = _shards(lambda sh: CriteoReader(data, batch_size=32, shard=sh), k)
            _assert_same(_concat([b for s in shards for b in s]), whole)
            if k <= 5:  # whole files: a shard parses exactly its files
                for s, r in enumerate(readers):
                    a, b = share_bounds(5, s, k)
                    assert r.stats.bytes == sum(f.stat().st_size for f in files[a:b])
    with pytest.raises(DataFileNotFoundError, match="no data file matches"):
        CriteoReader(str(tmp_path / "nothing-*.txt"), batch_size=4)


def test_csv_headers_stay_out_of_the_byte_ranges(tmp_path):
    rng = np.random.default_rng(9)
    paths = []
    for i in range(2):
        rows = [f"{int(rng.integers(0, 2))},{rng.choice(['a', 'bb', '', 'ccc'])},{rng.integers(0, 99)}"
                for _ in range(101)]
        p = tmp_path / f"{i}.csv"
        p.write_text("click,s,t\n" + "\n".join(rows) + "\n")
        paths.append(p)
    whole = _concat(list(CsvReader(paths, batch_size=40).batches()))
    for k in (3, 4, 6):
        shards, readers = _shards(lambda sh: CsvReader(paths, batch_size=40, strict=True, shard=sh), k)
        _assert_same(_concat([b for s in shards for b in s]), whole)
    libsvm = tmp_path / "d.libfm"
    libsvm.write_text("".join(f"1 {i}:1 {i + 1}:2\n" for i in range(50)))
    got = [b for s in range(3) for b in LibsvmReader(libsvm, batch_size=7, shard=(s, 3)).batches()]
    assert sum(len(b) for b in got) == 50


def test_synthetic_shards_are_contiguous_rows_whatever_the_batch_size():
    kw = dict(rows=2500, fields=3, vocab_per_field=100, block_rows=1000)
    whole = _concat(list(SyntheticData(**kw, batch_size=1000).batches()))
    for k in (2, 3, 6):
        parts = [b for s in range(k) for b in SyntheticData(**kw, batch_size=77, shard=(s, k)).batches()]
        _assert_same(_concat(parts), whole)
    d = SyntheticData(**kw, batch_size=77, shard=(1, 3))
    assert [len(b) for b in d.batches()] == [77] * 10 + [63]  # 833 rows
    _assert_same(_concat(list(d.batches(start_batch=4))), _concat(list(d.batches())[4:]))
    ev = [b for s in range(3) for b in SyntheticData(**kw, batch_size=50, shard=(s, 3)).eval_batches()]
    _assert_same(_concat(ev), _concat(list(SyntheticData(**kw, batch_size=1000).eval_batches())))


def test_open_dataset_passes_the_shard(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text("\n".join(_random_lines(np.random.default_rng(1), 30)) + "\n")
    a = open_dataset(p, "criteo", 8, shard=(0, 2))
    b = open_dataset(p, "criteo", 8, shard=(1, 2))
    assert sum(len(x) for x in a.batches()) + sum(len(x) for x in b.batches()) == 30


def test_an_empty_shard_is_no_error_but_a_shard_of_garbage_is(tmp_path):
    lines = _random_lines(np.random.default_rng(4), 1)
    one = tmp_path / "one.txt"
    one.write_text(lines[0] + "\n")
    for s in (1, 2):  # the one line starts in shard 0's range: the others hold no line, which is fine
        r = CriteoReader(one, batch_size=4, shard=(s, 3))
        assert r.probe().lines == 0 and list(r.batches()) == []
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(Exception, match="no valid example"):  # but the whole data may not be empty
        list(CriteoReader(empty, batch_size=4).batches())
    good = tmp_path / "good.txt"  # good lines, then a file of garbage lines: a shard each
    good.write_text("\n".join(_random_lines(np.random.default_rng(5), 200)) + "\n")
    bad = tmp_path / "garbage.txt"
    bad.write_bytes(b"garbage\tline\n" * 2000)
    assert len(list(CriteoReader([good, bad], batch_size=64, shard=(0, 2)).batches())) == 4
    for call in (lambda r: r.probe(), lambda r: list(r.batches())):
        with pytest.raises(Exception, match=r"no valid example in .*garbage.txt \(shard 1 of 2\)"):
            call(CriteoReader([good, bad], batch_size=64, shard=(1, 2)))
