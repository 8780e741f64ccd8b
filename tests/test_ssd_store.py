"""SSDStore: API contract, errors, compaction bounds, HDF5, and model-based tests against DictStore."""

import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hps.errors import InvalidInputError, InvalidTypeError, StoreError, StoreFormatError
from hps.ssd import HEADER_SIZE, ROWS_ALIGN, SSDOptions, SSDStore
from tests.reference.store import DictStore

DIM = 4
NOBG = SSDOptions(background=False, io_threads=1)


def rows_for(keys, salt=0.0, dim=DIM):
    k = np.asarray(keys, dtype=np.float64)[:, None]
    return (k * 10 + np.arange(dim) + salt).astype(np.float32)


def test_dump_load_roundtrip_and_missing(tmp_path):
    with SSDStore(tmp_path / "s", DIM, rows_per_file=3, options=NOBG) as s:
        k = np.array([1, 2, 4, 6, 8, 9], dtype=np.uint64)
        s.dump(k, rows_for(k))
        q = np.array([9, 3, 1, 8], dtype=np.uint64)
        rows, found = s.load(q)
        assert found.tolist() == [True, False, True, True]
        np.testing.assert_array_equal(rows[found], rows_for(q[found]))
        assert (rows[~found] == 0).all()
        st_ = s.stats()
        assert st_["files"] == 2 and st_["live_rows"] == 6 and st_["stale_rows"] == 0
        assert st_["bytes_read"] == 2 * 4096      # the one 4 KiB block of each file holding asked rows


@pytest.mark.parametrize("threads", [1, 4])
def test_load_reads_only_the_blocks_of_asked_rows(tmp_path, threads):
    """Rows of 16 B: 256 to a 4 KiB block. Asked rows in blocks 0, 1 (adjacent: one read) and 9 of
    one 16-block file, and block 0 of another: 4 blocks read of 32, each row right."""
    opts = SSDOptions(background=False, io_threads=threads)
    with SSDStore(tmp_path / "s", DIM, rows_per_file=4096, options=opts) as s:
        k = np.arange(8192, dtype=np.uint64)
        s.dump(k, rows_for(k))
        assert s.stats()["disk_bytes"] > 32 * 4096
        q = np.array([300, 5, 2400, 255, 256, 5, 4096, 4097], dtype=np.uint64)
        got, found = s.load(q)
        assert found.all()
        np.testing.assert_array_equal(got, rows_for(q))
        assert s.stats()["bytes_read"] == 4 * 4096


def test_block_size_and_read_caps_are_options(tmp_path):
    """8 KiB blocks, reads of at most 8 KiB, a 16 KiB read buffer: a load of every row takes many
    rounds of reads and still returns every row."""
    opts = SSDOptions(background=False, io_threads=3, block_bytes=8192, max_read_bytes=8192,
                      read_buffer_bytes=16384)
    with SSDStore(tmp_path / "s", 4, dtype=np.float64, rows_per_file=3000, options=opts) as s:
        k = np.arange(7000, dtype=np.uint64)
        r = np.random.default_rng(0).standard_normal((7000, 4))
        s.dump(k, r)
        got, found = s.load(k[::-1])
        assert found.all()
        np.testing.assert_array_equal(got, r[::-1])
        assert s.stats()["bytes_read"] == (12 + 12 + 4) * 8192   # every block of rows once, no header
    with pytest.raises(InvalidInputError, match="multiple of 4096"):
        SSDOptions(block_bytes=1000)
    with pytest.raises(InvalidInputError, match="page_cache"):
        SSDOptions(page_cache="maybe")


def test_duplicates_in_one_dump_last_wins(tmp_path):
    with SSDStore(tmp_path / "s", DIM, rows_per_file=2, options=NOBG) as s:
        k = np.array([5, 7, 5, 5, 9], dtype=np.uint64)
        r = rows_for(np.arange(5))
        s.dump(k, r)
        got, found = s.load(np.array([5, 7, 9], dtype=np.uint64))
        assert found.all()
        np.testing.assert_array_equal(got, r[[3, 1, 4]])
        assert s.stats()["live_rows"] == 3 and s.stats()["stale_rows"] == 2
        s.close()
        with SSDStore(tmp_path / "s", DIM, rows_per_file=2, options=NOBG) as s2:
            np.testing.assert_array_equal(s2.load(np.array([5, 7, 9], dtype=np.uint64))[0], r[[3, 1, 4]])
            assert s2.stats()["stale_rows"] == 2


def test_empty_batches(tmp_path):
    with SSDStore(tmp_path / "s", DIM, options=NOBG) as s:
        s.dump(np.empty(0, np.uint64), np.empty((0, DIM), np.float32))
        rows, found = s.load(np.empty(0, np.uint64))
        assert rows.shape == (0, DIM) and found.shape == (0,)
        assert s.stats()["files"] == 0


def test_int64_keys_and_float64_store(tmp_path):
    with SSDStore(tmp_path / "s", 3, dtype=np.float64, options=NOBG) as s:
        k = np.array([-2, 3], dtype=np.int64)
        r = np.array([[np.nan, np.inf, -np.inf], [1e300, 0, -0.0]])
        s.dump(k, r)
        got, found = s.load(k)
        assert found.all() and got.dtype == np.float64
        np.testing.assert_array_equal(got, r)


def test_bad_input(tmp_path):
    with SSDStore(tmp_path / "s", DIM, options=NOBG) as s:
        with pytest.raises(InvalidInputError, match="sentinel"):
            s.dump(np.array([2**64 - 1], np.uint64), np.zeros((1, DIM)))
        with pytest.raises(InvalidInputError, match="sentinel"):
            s.load(np.array([-1], np.int64))
        with pytest.raises(InvalidInputError, match="shape"):
            s.dump(np.array([1], np.uint64), np.zeros((1, DIM + 1)))
        with pytest.raises(InvalidTypeError):
            s.dump(np.array([1.0]), np.zeros((1, DIM)))
        assert s.stats()["files"] == 0


def test_wrong_dim_dtype_and_not_a_store(tmp_path):
    SSDStore(tmp_path / "s", DIM, options=NOBG).close()
    with pytest.raises(StoreFormatError, match="dim=4"):
        SSDStore(tmp_path / "s", DIM + 1, options=NOBG)
    with pytest.raises(StoreFormatError, match="dtype"):
        SSDStore(tmp_path / "s", DIM, dtype=np.float64, options=NOBG)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("hello")
    with pytest.raises(StoreFormatError, match="not an hps SSD store"):
        SSDStore(other, DIM, options=NOBG)
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(StoreFormatError, match="not a directory"):
        SSDStore(tmp_path / "file", DIM, options=NOBG)
    (other / "STORE").write_bytes(b"garbage that is no descriptor")
    with pytest.raises(StoreFormatError):
        SSDStore(other, DIM, options=NOBG)


def test_second_open_is_refused_and_closed_store_raises(tmp_path):
    s = SSDStore(tmp_path / "s", DIM, options=NOBG)
    with pytest.raises(StoreError, match="another process"):
        SSDStore(tmp_path / "s", DIM, options=NOBG)
    s.close()
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.load(np.array([1], np.uint64))
    SSDStore(tmp_path / "s", DIM, options=NOBG).close()


def _check_bound(s, dim=DIM):
    st_ = s.stats()
    rows_on_disk = st_["live_rows"] + st_["stale_rows"]
    assert rows_on_disk <= 2 * st_["live_rows"]
    row_bytes = 16 + dim * 4 + 4 * dim * 4 / 4096          # key, version, row, its share of a block crc
    per_file = HEADER_SIZE + ROWS_ALIGN + 4096 + 4          # header, alignment of the rows, last block
    assert st_["disk_bytes"] <= 2 * st_["live_rows"] * row_bytes + st_["files"] * per_file


def test_compaction_bound_and_values(tmp_path):
    rng = np.random.default_rng(0)
    ref = DictStore(DIM)
    with SSDStore(tmp_path / "s", DIM, rows_per_file=64, options=NOBG) as s:
        for i in range(40):
            k = rng.integers(0, 500, size=rng.integers(1, 300)).astype(np.uint64)
            r = rows_for(k, salt=i)
            s.dump(k, r)
            ref.dump(k, r)
        assert s.stats()["stale_rows"] > s.stats()["live_rows"]
        removed = s.compact()
        assert removed > 0 and s.stats()["compactions"] == 1
        _check_bound(s)
        q = np.arange(520, dtype=np.uint64)
        got, found = s.load(q)
        want, wfound = ref.load(q)
        np.testing.assert_array_equal(found, wfound)
        np.testing.assert_array_equal(got, want)
        n_files = len(list((tmp_path / "s").glob("*.param")))
        assert n_files == s.stats()["files"]


def test_background_compaction_runs_by_itself(tmp_path):
    opts = SSDOptions(compact_interval_s=0.01)
    with SSDStore(tmp_path / "s", DIM, rows_per_file=16, options=opts) as s:
        k = np.arange(64, dtype=np.uint64)
        for i in range(10):
            s.dump(k, rows_for(k, i))
        for _ in range(500):
            if s.stats()["compactions"] > 0 and s.stats()["stale_rows"] <= 64:
                break
            threading.Event().wait(0.01)
        assert s.stats()["compactions"] > 0
        _check_bound(s)
        np.testing.assert_array_equal(s.load(k)[0], rows_for(k, 9))


@pytest.mark.parametrize("cut", ["closed", "io"])
def test_close_during_a_background_compaction_is_not_a_failure(tmp_path, caplog, cut):
    """close() while a background round runs makes the round's next step raise "store is closed":
    the thread ends quietly instead of logging a failed compaction. A real failure (an OSError) that
    comes as close() does is still counted and logged."""
    s = SSDStore(tmp_path / "s", DIM, rows_per_file=16, options=SSDOptions(compact_interval_s=0.01))
    started = threading.Event()

    def round_cut_by_close(force):
        started.set()
        while not s._cat.closed:   # a round in progress when close() comes
            threading.Event().wait(0.001)
        if cut == "io":
            raise OSError(5, "Input/output error")
        raise StoreError(f"store {str(s.path)!r} is closed")

    s._compactor.run = round_cut_by_close
    assert started.wait(10)
    with caplog.at_level("WARNING", logger="hps.ssd"):
        s.close()
    failed = [r.getMessage() for r in caplog.records if "compaction" in r.getMessage()]
    if cut == "closed":
        assert not failed and s._cat.stats()["compaction_errors"] == 0, caplog.text
    else:
        assert len(failed) == 1 and "Input/output error" in failed[0], caplog.text
        assert s._cat.stats()["compaction_errors"] == 1


def test_h5_roundtrip(tmp_path):
    with SSDStore(tmp_path / "a", DIM, rows_per_file=8, options=NOBG) as a:
        k = np.arange(0, 100, 3, dtype=np.uint64)
        a.dump(k, rows_for(k))
        a.dump(k[:5], rows_for(k[:5], 1))
        assert a.export_h5(tmp_path / "x.h5") == k.shape[0]
        with SSDStore(tmp_path / "b", DIM, rows_per_file=5, options=NOBG) as b:
            assert b.import_h5(tmp_path / "x.h5") == k.shape[0]
            np.testing.assert_array_equal(b.load(k)[0], a.load(k)[0])
        with SSDStore(tmp_path / "c", DIM + 1, options=NOBG) as c:
            with pytest.raises(StoreFormatError, match="dim"):
                c.import_h5(tmp_path / "x.h5")


def test_concurrent_dump_load_compact_never_reverts(tmp_path):
    """Writers rewrite keys with increasing values while compaction runs; values never go back."""
    opts = SSDOptions(compact_interval_s=0.001, compact_ratio=1.0)
    keys = np.arange(200, dtype=np.uint64)
    errors = []
    with SSDStore(tmp_path / "s", DIM, rows_per_file=16, options=opts) as s:
        s.dump(keys, np.zeros((200, DIM), np.float32))
        stop = threading.Event()

        def writer():
            rng = np.random.default_rng(1)
            for gen in range(1, 150):
                k = rng.choice(keys, 40, replace=False)
                s.dump(k, np.full((40, DIM), gen, np.float32))
            stop.set()

        def reader():
            last = np.zeros(200, np.float32)
            while not stop.is_set():
                got, found = s.load(keys)
                if not found.all() or (got[:, 0] < last).any() or (got != got[:, :1]).any():
                    errors.append("reverted or torn")
                    return
                last = got[:, 0]

        def compactor():
            while not stop.is_set():
                s.compact()

        ts = [threading.Thread(target=f) for f in (writer, reader, compactor)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert not errors
        final = s.load(keys)[0][:, 0].copy()
        assert s.stats()["compactions"] > 0
    with SSDStore(tmp_path / "s", DIM, rows_per_file=16, options=NOBG) as s:
        np.testing.assert_array_equal(s.load(keys)[0][:, 0], final)


# -- model-based: random operation sequences against the dict reference --------------------------

KEYS = st.integers(0, 60)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("dump"), st.lists(KEYS, min_size=0, max_size=40)),
        st.tuples(st.just("load"), st.lists(KEYS, min_size=0, max_size=40)),
        st.tuples(st.just("compact"), st.none()),
        st.tuples(st.just("reopen"), st.none()),
    ),
    min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, rpf=st.sampled_from([1, 3, 8, 64]), background=st.booleans(), wide=st.booleans())
def test_model_based(tmp_path_factory, ops, rpf, background, wide):
    """``wide``: rows of 1,200 B (most straddle two 4 KiB blocks), reads of at most 8 KiB and 8 KiB
    per round (many rounds per load), merged files of a few rows (small compaction batches)."""
    path = tmp_path_factory.mktemp("m") / "s"
    dim = 300 if wide else DIM
    caps = dict(max_read_bytes=8192, read_buffer_bytes=8192, compact_batch_bytes=5000) if wide else {}
    opts = SSDOptions(background=background, compact_interval_s=0.001, compact_ratio=1.0, **caps)
    ref = DictStore(dim)
    s = SSDStore(path, dim, rows_per_file=rpf, options=opts)
    try:
        for i, (op, arg) in enumerate(ops):
            if op == "dump":
                k = np.array(arg, dtype=np.uint64)
                r = rows_for(k, salt=i, dim=dim)
                s.dump(k, r)
                ref.dump(k, r)
            elif op == "load":
                k = np.array(arg, dtype=np.uint64)
                got, found = s.load(k)
                want, wfound = ref.load(k)
                np.testing.assert_array_equal(found, wfound)
                np.testing.assert_array_equal(got, want)
            elif op == "compact":
                s.compact()
                if not background:
                    _check_bound(s, dim)
            else:
                s.close()
                s = SSDStore(path, dim, rows_per_file=rpf, options=opts)
                assert s.stats()["recovered_rows"] == len(ref)
            assert s.stats()["live_rows"] == len(ref)
        allk, allr = ref.items()
        np.testing.assert_array_equal(s.load(allk)[0], allr)
    finally:
        s.close()


def test_read_handles_are_reused_and_bounded(tmp_path):
    """Loads keep at most ``cap`` idle file handles open; deleted files release theirs."""
    from hps.ssd import _handles

    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    with SSDStore(tmp_path / "s", 4, rows_per_file=8) as s:
        s._io._fds._cap = 3
        keys = np.arange(200, dtype=np.uint64)
        s.dump(keys, np.tile(keys[:, None], (1, 4)).astype(np.float32))      # 25 files
        before = open_fds()
        for _ in range(3):
            rows, found = s.load(keys)
            assert found.all() and (rows[:, 0] == keys).all()
        assert open_fds() - before <= 3
        s.dump(keys, np.zeros((200, 4), np.float32))                          # all old files stale
        s.compact()
        assert (s.load(keys)[0] == 0).all()
        assert len(s._io._fds._open) <= 3
    assert isinstance(s._io._fds, _handles.FdCache) and len(s._io._fds._open) == 0   # closed with the store


def test_checksum_is_zlib_crc32():
    """The on-disk checksums are CRC-32 as zlib computes it, whichever library computes it."""
    import zlib

    from hps.ssd import _format as F
    data = np.random.default_rng(0).standard_normal((1000, 7)).astype(np.float32)
    mv = memoryview(data.tobytes())
    assert F.crc32(data) == zlib.crc32(data)
    assert F.crc32(mv[13:4001]) == zlib.crc32(mv[13:4001])
    assert F.crc32(mv[5:], 0xDEADBEEF) == zlib.crc32(mv[5:], 0xDEADBEEF)
    assert F.crc32(b"") == 0


@pytest.mark.parametrize("mode", ["direct", "dontneed", "keep"])
def test_page_cache_modes_read_the_same_rows(tmp_path, mode):
    """Every page-cache policy reads the same rows, also on tmpfs (/dev/shm), which refuses O_DIRECT
    ("direct" then reads through the page cache)."""
    roots = [tmp_path] + ([Path("/dev/shm")] if os.path.isdir("/dev/shm") else [])
    for root in roots:
        path = root / f"hps-test-{os.getpid()}-{mode}"
        try:
            with SSDStore(path, DIM, rows_per_file=300, options=SSDOptions(background=False, page_cache=mode)) as s:
                k = np.arange(1000, dtype=np.uint64)
                s.dump(k, rows_for(k))
                q = np.array([999, 0, 301, 300, 299, 5], dtype=np.uint64)
                np.testing.assert_array_equal(s.load(q)[0], rows_for(q))
        finally:
            shutil.rmtree(path, ignore_errors=True)


def test_load_into_refuses_rows_outside_out_and_bad_arguments_are_typed(tmp_path):
    """load_into's ``at`` is checked against ``out`` (the read path writes unchecked: row 2 of a 1-row view
    was written into its parent, and -1 wrapped); arguments that are no numbers, and a compaction after
    close, raise hps errors as the other calls do."""
    s = SSDStore(tmp_path / "s", 3)
    s.dump(np.array([7], np.uint64), np.full((1, 3), 9, np.float32))
    big = np.zeros((4, 3), np.float32)
    for at in ([2], [-1]):
        with pytest.raises(InvalidInputError, match=r"at in \[0, 1\)"):
            s.load_into(np.array([7], np.uint64), big[:1], np.array(at))
    assert not big.any()
    assert s.load_into(np.array([7], np.uint64), big, np.array([2])).tolist() == [True] and big[2, 0] == 9
    with pytest.raises(InvalidInputError, match="chunk_rows"):
        list(s.iter_rows(chunk_rows=0))
    s.close()
    with pytest.raises(StoreError, match="is closed"):
        s.compact()
    for kw in ({"dim": "a"}, {"dim": 0}, {"dim": 3, "rows_per_file": 2.5}):
        with pytest.raises(InvalidInputError):
            SSDStore(tmp_path / "t", **kw)
