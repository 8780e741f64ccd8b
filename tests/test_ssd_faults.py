"""SSDStore under injected faults (through the Env): ENOSPC, short writes, flipped bytes, crashes
between steps of a dump or a compaction, and the fsync/rename order that makes a dump durable."""

import errno
import threading

import numpy as np
import pytest

from hps.errors import CorruptionError, DiskFullError
from hps.ssd import HEADER_SIZE, PosixEnv, SSDOptions, SSDStore
from tests.reference.store import DictStore

DIM = 4
NOBG = SSDOptions(background=False, io_threads=1)


def rows_for(keys, salt=0.0):
    return (np.asarray(keys, dtype=np.float64)[:, None] * 10 + np.arange(DIM) + salt).astype(np.float32)


class Crash(BaseException):
    """Simulated process death at an Env call (not an Exception: nothing may swallow it)."""


class FaultEnv(PosixEnv):
    """PosixEnv that records calls and runs ``hooks[op](args)`` before an operation."""

    def __init__(self):
        self.calls = []
        self.hooks = {}
        self._mu = threading.Lock()

    def _at(self, op, *args):
        with self._mu:
            self.calls.append((op,) + args)
        hook = self.hooks.get(op)
        if hook is not None:
            hook(*args)

    def open_write(self, path):
        h = super().open_write(path)
        self._at("open_write", path)
        return h

    def write(self, handle, data):
        self._at("write", handle, memoryview(data).nbytes)
        super().write(handle, data)

    def fsync(self, handle):
        self._at("fsync", handle)
        super().fsync(handle)

    def rename(self, src, dst):
        self._at("rename", src, dst)
        super().rename(src, dst)

    def remove(self, path):
        self._at("remove", path)
        super().remove(path)

    def fsync_dir(self, path):
        self._at("fsync_dir", path)
        super().fsync_dir(path)


def params(path):
    return sorted(p.name for p in path.iterdir() if p.name.endswith(".param"))


def tmps(path):
    return sorted(p.name for p in path.iterdir() if p.name.endswith(".tmp"))


def nth(n, exc):
    """A hook that raises ``exc()`` on its n-th call (1-based)."""
    count = [0]
    mu = threading.Lock()

    def hook(*args):
        with mu:
            count[0] += 1
            hit = count[0] == n
        if hit:
            raise exc()
    return hook


def crash_release(s):
    """After a simulated crash: drop the dead store's lock so the directory can be reopened."""
    s._io.env.unlock(s._lock_handle)
    s._lock_handle = None


def test_dump_is_durable_before_it_is_visible(tmp_path):
    env = FaultEnv()
    s = SSDStore(tmp_path / "s", DIM, rows_per_file=2, options=NOBG, env=env)
    k = np.array([1, 2, 3], dtype=np.uint64)
    seen = []
    env.hooks["fsync_dir"] = lambda path: seen.append(s.load(k)[1].any())
    env.calls.clear()
    s.dump(k, rows_for(k))
    ops = [c[0] for c in env.calls]
    # each file: open, write..., fsync, rename; a directory fsync; then the manifest: write its temp
    # file, fsync, rename it over MANIFEST, fsync the directory; nothing visible before the last
    assert ops.count("fsync") == 3 and ops.count("rename") == 3 and ops.count("fsync_dir") == 2
    renames = [c for c in env.calls if c[0] == "rename"]
    assert all(c[1].endswith(".param.tmp") and c[2].endswith(".param") for c in renames[:2])
    assert renames[2][1].endswith("MANIFEST.tmp") and renames[2][2].endswith("MANIFEST")
    assert ops.index("fsync_dir") < ops.index("rename", ops.index("fsync_dir")) and ops[-1] == "fsync_dir"
    for i, c in enumerate(env.calls):
        if c[0] == "rename":
            assert env.calls[i - 1][0] == "fsync"
    assert seen == [False, False]
    assert s.load(k)[1].all()
    s.close()


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("fault", ["enospc_open", "enospc_write", "short_write", "enospc_fsync"])
def test_disk_full_mid_dump_leaves_no_half_file(tmp_path, fault, threads):
    env = FaultEnv()
    path = tmp_path / "s"
    s = SSDStore(path, DIM, rows_per_file=4, options=SSDOptions(background=False, io_threads=threads),
                 env=env)
    k0 = np.arange(10, dtype=np.uint64)
    s.dump(k0, rows_for(k0))
    before = params(path)

    def enospc():
        return OSError(errno.ENOSPC, "No space left on device")

    if fault == "enospc_open":
        env.hooks["open_write"] = nth(2, enospc)          # second file of the dump
    elif fault == "enospc_write":
        env.hooks["write"] = nth(7, enospc)                # inside the second file
    elif fault == "enospc_fsync":
        env.hooks["fsync"] = nth(2, enospc)
    else:
        real_write = PosixEnv.write
        count = [0]
        mu = threading.Lock()

        def short(self, handle, data):        # the 6th write: half of it lands, then ENOSPC
            mv = memoryview(data).cast("B")
            with mu:
                count[0] += 1
                hit = count[0] == 6
            if hit:
                real_write(self, handle, mv[: mv.nbytes // 2])
                raise OSError(errno.ENOSPC, "No space left on device")
            real_write(self, handle, mv)
        env.write = short.__get__(env)
    k1 = np.arange(5, 15, dtype=np.uint64)
    with pytest.raises(DiskFullError, match="no space left") as ei:
        s.dump(k1, rows_for(k1, 100))
    assert ei.value.errno == errno.ENOSPC
    assert params(path) == before and tmps(path) == []
    np.testing.assert_array_equal(s.load(k0)[0], rows_for(k0))       # acknowledged rows intact
    assert not s.load(np.arange(10, 15, dtype=np.uint64))[1].any()
    env.hooks.clear()
    env.write = PosixEnv.write.__get__(env)
    s.dump(k1, rows_for(k1, 200))                                     # space is back: works again
    s.close()
    with SSDStore(path, DIM, rows_per_file=4, options=NOBG) as s2:
        want = np.concatenate([rows_for(k0[:5]), rows_for(k1, 200)])
        np.testing.assert_array_equal(s2.load(np.arange(15, dtype=np.uint64))[0], want)


def _one_file_store(path):
    with SSDStore(path, DIM, rows_per_file=64, options=NOBG) as s:
        k = np.arange(20, dtype=np.uint64)
        s.dump(k, rows_for(k))
    return path / params(path)[0], k


def _regions(f):
    """Byte positions in every region of a one-file store's file: header, keys, block crcs,
    alignment padding, first/middle/last byte of each rows block (the last one's zero padding too)."""
    from hps.ssd._format import Header
    buf = f.read_bytes()
    lay = Header(buf, str(f), len(buf)).layout
    meta = {"header": [0, 9, 30, 59, 60, 63], "keys": [HEADER_SIZE, HEADER_SIZE + 77],
            "crcs": [lay.crcs_offset, lay.crcs_offset + 4 * lay.n_blocks - 1],
            "padding": [lay.crcs_offset + 4 * lay.n_blocks, lay.rows_offset - 1]}
    rows = []
    for b in range(lay.n_blocks):
        start = lay.rows_offset + b * lay.block_bytes
        rows += [start, start + lay.block_bytes // 2, start + lay.block_bytes - 1]
    return meta, rows, lay


def _flip(f, pos):
    buf = bytearray(f.read_bytes())
    buf[pos] ^= 0x10
    f.write_bytes(bytes(buf))


def _one_big_file_store(path):
    with SSDStore(path, DIM, rows_per_file=1000, options=NOBG) as s:
        k = np.arange(700, dtype=np.uint64)          # 700 rows of 16 B: 3 blocks, the last one padded
        s.dump(k, rows_for(k))
    return path / params(path)[0], k


def test_flipped_byte_in_any_block_raises_on_load(tmp_path):
    """Every block is checked by its own crc: a flip in any byte of any block (its padding too) is
    caught by a load that reads that block, and only by such a load."""
    f, k = _one_big_file_store(tmp_path / "s")
    _, rows, lay = _regions(f)
    good = f.read_bytes()
    per_block = lay.block_bytes // (DIM * 4)
    for pos in rows:
        _flip(f, pos)
        blk = (pos - lay.rows_offset) // lay.block_bytes
        with SSDStore(tmp_path / "s", DIM, options=NOBG) as s:        # the keys sections are fine: opens
            with pytest.raises(CorruptionError, match="rows section checksum"):
                s.load(k[blk * per_block:][:1])
            other = k[((blk + 1) % lay.n_blocks) * per_block:][:1]
            np.testing.assert_array_equal(s.load(other)[0], rows_for(other))
            with pytest.raises(CorruptionError):
                s.export_h5(tmp_path / "x.h5")
        f.write_bytes(good)


def test_flipped_byte_in_header_keys_crcs_or_padding_raises_on_open(tmp_path):
    f, _ = _one_big_file_store(tmp_path / "s")
    meta, _, _ = _regions(f)
    good = f.read_bytes()
    for region, positions in meta.items():
        for pos in positions:
            _flip(f, pos)
            with pytest.raises(CorruptionError):
                SSDStore(tmp_path / "s", DIM, options=NOBG)
            f.write_bytes(good)
    SSDStore(tmp_path / "s", DIM, options=NOBG).close()


def test_truncated_acknowledged_file_raises(tmp_path):
    f, _ = _one_file_store(tmp_path / "s")
    f.write_bytes(f.read_bytes()[:-8])
    with pytest.raises(CorruptionError, match="manifest says"):
        SSDStore(tmp_path / "s", DIM, options=NOBG)


def test_corrupt_victim_fails_compaction_not_data(tmp_path):
    with SSDStore(tmp_path / "s", DIM, rows_per_file=4, options=NOBG) as s:
        k = np.arange(8, dtype=np.uint64)
        s.dump(k, rows_for(k))
        s.dump(k[:7], rows_for(k[:7], 1))
        victim = tmp_path / "s" / params(tmp_path / "s")[1]     # keys 4..7, 3 of 4 stale
        buf = bytearray(victim.read_bytes())
        buf[-1] ^= 0xFF
        victim.write_bytes(bytes(buf))
        with pytest.raises(CorruptionError):
            s.compact()
        np.testing.assert_array_equal(s.load(k[:7])[0], rows_for(k[:7], 1))
        assert s.stats()["files"] == 4


def test_torn_temp_file_is_discarded(tmp_path):
    path = tmp_path / "s"
    with SSDStore(path, DIM, options=NOBG) as s:
        k = np.arange(5, dtype=np.uint64)
        s.dump(k, rows_for(k))
    (path / "00000000000000ff.param.tmp").write_bytes(b"\x00" * 77)      # never renamed into place
    with SSDStore(path, DIM, options=NOBG) as s:
        st_ = s.stats()
        assert st_["discarded_files"] == 1 and st_["recovered_rows"] == 5 and st_["recovered_files"] == 1
        assert tmps(path) == []
        s.dump(k, rows_for(k, 1))                       # sequence numbers continue past the files
        np.testing.assert_array_equal(s.load(k)[0], rows_for(k, 1))


def _stale_store(path, env):
    """3 files of 4 rows; the first two are >50 % stale; returns (store, reference)."""
    s = SSDStore(path, DIM, rows_per_file=4, options=NOBG, env=env)
    ref = DictStore(DIM)
    for i, k in enumerate([np.arange(8), np.array([0, 1, 2, 4, 5, 6]), np.array([9, 10])]):
        k = k.astype(np.uint64)
        s.dump(k, rows_for(k, i))
        ref.dump(k, rows_for(k, i))
    return s, ref


@pytest.mark.parametrize("op,n", [("open_write", 1), ("rename", 1), ("fsync_dir", 1), ("remove", 1),
                                  ("remove", 2)])
def test_crash_at_each_step_of_compaction_recovers(tmp_path, op, n):
    env = FaultEnv()
    path = tmp_path / "s"
    s, ref = _stale_store(path, env)
    env.hooks[op] = nth(n, Crash)
    with pytest.raises(Crash):
        s.compact()
    crash_release(s)
    with SSDStore(path, DIM, rows_per_file=4, options=NOBG) as s2:
        allk, allr = ref.items()
        got, found = s2.load(allk)
        assert found.all()
        np.testing.assert_array_equal(got, allr)
        assert s2.stats()["live_rows"] == len(ref)
        s2.compact()
        np.testing.assert_array_equal(s2.load(allk)[0], allr)


def test_dump_during_compaction_keeps_the_new_value(tmp_path):
    """A key rewritten while its file is being merged keeps the dump's value, now and after a crash
    that leaves the merged file, the old file and the newer dump all on disk."""
    env = FaultEnv()
    path = tmp_path / "s"
    s, ref = _stale_store(path, env)
    k3 = np.array([3, 7], dtype=np.uint64)                 # live rows of the two victims

    def dump_meanwhile(p):
        if not env.hooks.get("_done"):
            env.hooks["_done"] = True
            s.dump(k3, rows_for(k3, 99))                   # lands while the merged file is written
    env.hooks["fsync_dir"] = dump_meanwhile
    s.compact()
    ref.dump(k3, rows_for(k3, 99))
    allk, allr = ref.items()
    np.testing.assert_array_equal(s.load(allk)[0], allr)
    assert s.stats()["live_rows"] == len(ref)
    s.close()
    with SSDStore(path, DIM, rows_per_file=4, options=NOBG) as s2:
        np.testing.assert_array_equal(s2.load(allk)[0], allr)


def test_merged_copy_never_overrides_newer_dump_on_recovery(tmp_path):
    """Crash state: a merged file with a HIGHER sequence number than a newer dump of the same key
    (the dump landed between the merge's snapshot and its write). The dump's version must win."""
    path = tmp_path / "s"
    s = SSDStore(path, DIM, rows_per_file=4, options=NOBG)
    k = np.array([3], dtype=np.uint64)
    s.dump(k, rows_for(k, 1))                    # seq 1: version 1
    s.dump(k, rows_for(k, 2))                    # seq 2: version 2 (the newest)
    # what compaction would write for the snapshot of seq 1: seq 9, row version 1
    merged = s._io.write_param(9, k.astype("<u8"), np.array([1], "<u8"), rows_for(k, 1))
    s._io.write_manifest(*s._cat.manifest(add=[merged]))     # the compaction's manifest switch
    crash_release(s)
    with SSDStore(path, DIM, rows_per_file=4, options=NOBG) as s2:
        np.testing.assert_array_equal(s2.load(k)[0], rows_for(k, 2))
        s2.compact()
        np.testing.assert_array_equal(s2.load(k)[0], rows_for(k, 2))
        s2.dump(k, rows_for(k, 3))               # new dumps get sequence numbers past the merged file
    with SSDStore(path, DIM, rows_per_file=4, options=NOBG) as s3:
        np.testing.assert_array_equal(s3.load(k)[0], rows_for(k, 3))
