"""The SSD-PS block reader's batch path: a load issues its reads and checks its blocks in nogil
kernels (``hps.ssd._native``), never one Python call per read; an Env that overrides ``read_into``
still sees every read (fault injection); short reads and flipped bytes are still caught."""

import os
import zlib

import numpy as np
import pytest

from hps.errors import CorruptionError, InvalidInputError
from hps.ssd import PosixEnv, SSDOptions, SSDStore
from hps.ssd import _format as F
from hps.ssd import _native
from hps.ssd import _read_kernels as K

DIM = 8
OPTS = SSDOptions(background=False, io_threads=4, max_read_bytes=4096)


def rows_for(keys):
    return (np.asarray(keys, dtype=np.float64)[:, None] * 10 + np.arange(DIM)).astype(np.float32)


def _store(path, env=None, n=5000):
    s = SSDStore(path, DIM, rows_per_file=2000, options=OPTS, env=env)
    k = np.arange(1, n + 1, dtype=np.uint64)
    s.dump(k, rows_for(k))
    return s


def test_load_makes_no_python_read_call_per_block(tmp_path, monkeypatch):
    if _native.PREAD is None or _native.CRC32 is None:
        pytest.skip("no native pread/crc32 on this platform")
    s = _store(tmp_path / "s")
    try:
        q = np.random.default_rng(0).choice(np.arange(1, 5001, dtype=np.uint64), 700, replace=False)
        calls = []

        def counted(*a, **kw):
            calls.append(a)
            return real(*a, **kw)

        real = os.preadv
        monkeypatch.setattr(os, "preadv", counted)
        monkeypatch.setattr(F, "crc32", lambda *a: calls.append(a) or 0)
        rows, found = s.load(q)
        assert found.all()
        np.testing.assert_array_equal(rows, rows_for(q))
        assert s.stats()["bytes_read"] >= 30 * 4096       # many blocks were read ...
        assert calls == []                                # ... and none through a Python call
    finally:
        s.close()


class CountingEnv(PosixEnv):
    """Overrides read_into: every read of rows must come through it (the fault-injection path)."""

    def __init__(self):
        self.reads = 0
        self.flip = False

    def read_into(self, handle, offset, buf):
        got = super().read_into(handle, offset, buf)
        self.reads += 1
        if self.flip:
            memoryview(buf).cast("B")[got // 2] ^= 0x01
        return got


def test_env_overriding_read_into_sees_every_read(tmp_path):
    env = CountingEnv()
    s = _store(tmp_path / "s", env)
    try:
        q = np.arange(1, 5001, 250, dtype=np.uint64)   # 20 rows 2 KB apart: 20 separate blocks
        before = env.reads
        rows, found = s.load(q)
        np.testing.assert_array_equal(rows, rows_for(q))
        assert env.reads - before == 20
        env.flip = True
        with pytest.raises(CorruptionError, match="checksum mismatch"):
            s.load(q)
    finally:
        s.close()


def test_file_truncated_under_an_open_store_is_a_short_read(tmp_path):
    s = _store(tmp_path / "s")
    try:
        f = max((tmp_path / "s").glob("*.param"))
        os.truncate(f, f.stat().st_size - 4096)       # the last block of the newest file
        with pytest.raises(CorruptionError, match="short read"):
            s.load(np.array([5000], dtype=np.uint64))
        rows, _ = s.load(np.array([1, 2], dtype=np.uint64))  # other files still load
        np.testing.assert_array_equal(rows, rows_for([1, 2]))
    finally:
        s.close()


@pytest.mark.parametrize("crc", [_native._isal_crc32(), _native._zlib_crc32()], ids=["isal", "zlib"])
def test_first_bad_block_kernel_matches_zlib(crc):
    if crc is None:
        pytest.skip("this CRC-32 library is not there")
    rng = np.random.default_rng(1)
    buf = rng.integers(0, 256, 6 * 512, dtype=np.uint8)
    boffs = np.array([0, 1024, 2048], dtype=np.int64)     # three reads of two 512-byte blocks
    lens = np.full(3, 1024, dtype=np.int64)
    steps = np.full(3, 512, dtype=np.int64)
    want = np.array([zlib.crc32(buf[i * 512:(i + 1) * 512].tobytes()) for i in range(6)], dtype=np.uint32)
    cstart = np.array([0, 2, 4], dtype=np.int64)
    assert K.first_bad_block(crc, buf, boffs, lens, steps, cstart, want) == (-1, -1)
    buf[3 * 512 + 7] ^= 0x40                               # read 1, its second block
    assert K.first_bad_block(crc, buf, boffs, lens, steps, cstart, want) == (1, 1)


@pytest.mark.parametrize("fused", [True, False])
def test_one_kernel_call_per_thread_or_rounds_read_the_same(tmp_path, monkeypatch, fused):
    """With a read buffer of at least a block per I/O thread, each thread reads its share of a load
    in one ``read_scatter`` call; with less, the load goes in rounds. Same rows, same checks."""
    if _native.PREAD is None or _native.CRC32 is None:
        pytest.skip("no native pread/crc32 on this platform")
    buf = 8 * 4096 * 4 if fused else 4 * 4096    # io_threads 8: 4 blocks each, or half a block
    opts = SSDOptions(background=False, io_threads=8, max_read_bytes=4096, read_buffer_bytes=buf)
    s = SSDStore(tmp_path / "s", DIM, rows_per_file=2000, options=opts)
    try:
        k = np.arange(1, 5001, dtype=np.uint64)
        s.dump(k, rows_for(k))
        calls = []
        real = K.read_scatter
        monkeypatch.setattr(K, "read_scatter", lambda *a: calls.append(1) or real(*a))
        q = np.random.default_rng(2).choice(k, 900)          # duplicates too
        rows, found = s.load(q)
        assert found.all()
        np.testing.assert_array_equal(rows, rows_for(q))
        assert (0 < len(calls) <= 8) if fused else calls == []
        f = sorted((tmp_path / "s").glob("*.param"))[0]
        with open(f, "r+b") as fh:                        # a byte in the last block of the rows
            fh.seek(f.stat().st_size - 100)
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ 0x10]))
        with pytest.raises(CorruptionError, match="checksum mismatch"):
            s.load(k[:2000])
    finally:
        s.close()


def test_load_into_reads_found_rows_straight_into_place(tmp_path):
    s = SSDStore(str(tmp_path / "s"), 4)
    keys = np.arange(1, 6, dtype=np.uint64)
    s.dump(keys, np.arange(20, dtype=np.float32).reshape(5, 4))
    out = np.full((4, 4), -1.0, np.float32)
    found = s.load_into(np.array([3, 99, 1], np.uint64), out, np.array([0, 1, 3]))
    assert found.tolist() == [True, False, True]
    np.testing.assert_array_equal(out, [[8, 9, 10, 11], [-1] * 4, [-1] * 4, [0, 1, 2, 3]])
    with pytest.raises(InvalidInputError, match="load_into"):
        s.load_into(keys, out, np.arange(4))
    s.close()
