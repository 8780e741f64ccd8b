"""The manifest: a store knows which parameter files it should have (format 2). A deleted file is
detected, a dump or compaction whose manifest switch never happened leaves nothing behind, and a
crash at any step of the switch loses nothing acknowledged."""

import errno
import struct

import numpy as np
import pytest

from hps.errors import CorruptionError, DiskFullError
from hps.ssd import FORMAT_VERSION, STORE_STRUCT, SSDOptions, SSDStore
from tests.test_ssd_faults import Crash, FaultEnv, crash_release, nth, params, rows_for, tmps

DIM = 4
NOBG = SSDOptions(background=False, io_threads=1)


def _store(path, n_dumps=6):
    with SSDStore(path, DIM, rows_per_file=16, options=NOBG) as s:
        for i in range(n_dumps):
            k = np.arange(i * 40, i * 40 + 40, dtype=np.uint64)
            s.dump(k, rows_for(k, i))
    return np.arange(n_dumps * 40, dtype=np.uint64)


def test_every_deleted_parameter_file_is_detected(tmp_path):
    """Version 1 silently lost (or reverted) the rows of a deleted file; now every deletion raises,
    naming the file."""
    path = tmp_path / "s"
    _store(path)
    names = params(path)
    assert len(names) == 18
    for name in names:
        data = (path / name).read_bytes()
        (path / name).unlink()
        with pytest.raises(CorruptionError, match=name):
            SSDStore(path, DIM, options=NOBG)
        (path / name).write_bytes(data)
    SSDStore(path, DIM, options=NOBG).close()


def test_deleted_manifest_and_damaged_manifest_are_detected(tmp_path):
    path = tmp_path / "s"
    _store(path, 2)
    good = (path / "MANIFEST").read_bytes()
    for pos in (0, 12, 40, len(good) - 1):
        bad = bytearray(good)
        bad[pos] ^= 0x04
        (path / "MANIFEST").write_bytes(bytes(bad))
        with pytest.raises(CorruptionError):
            SSDStore(path, DIM, options=NOBG)
    (path / "MANIFEST").unlink()
    with pytest.raises(CorruptionError, match="MANIFEST is missing"):
        SSDStore(path, DIM, options=NOBG)
    (path / "MANIFEST").write_bytes(good)
    SSDStore(path, DIM, options=NOBG).close()


def test_new_store_is_format_2_with_a_manifest(tmp_path):
    SSDStore(tmp_path / "s", DIM, options=NOBG).close()
    desc = (tmp_path / "s" / "STORE").read_bytes()
    assert STORE_STRUCT.unpack(desc)[1] == FORMAT_VERSION == 2
    assert (tmp_path / "s" / "MANIFEST").read_bytes()[:8] == b"HPSMANIF"


@pytest.mark.parametrize("op,n", [("open_write", 1), ("rename", 1), ("fsync_dir", 1),
                                  ("open_write", 3), ("fsync", 3), ("rename", 3), ("fsync_dir", 2)])
def test_crash_at_each_step_of_a_dump(tmp_path, op, n):
    """A dump of 2 files killed at each Env call: on reopen its rows are all there or all absent,
    the earlier dumps are intact, and no file is left that the manifest does not list."""
    env = FaultEnv()
    path = tmp_path / "s"
    s = SSDStore(path, DIM, rows_per_file=16, options=NOBG, env=env)
    k0 = np.arange(20, dtype=np.uint64)
    s.dump(k0, rows_for(k0))
    env.calls.clear()
    env.hooks[op] = nth(n, Crash)
    k1 = np.arange(10, 30, dtype=np.uint64)
    with pytest.raises(Crash):
        s.dump(k1, rows_for(k1, 1))
    crash_release(s)
    with SSDStore(path, DIM, rows_per_file=16, options=NOBG) as s2:
        got, found = s2.load(np.arange(30, dtype=np.uint64))
        landed = bool(found[20:].any())
        assert found[20:].all() == landed
        want = np.concatenate([rows_for(k0[:10]), rows_for(k1, 1)]) if landed else rows_for(k0)
        np.testing.assert_array_equal(got[: want.shape[0]], want)
        assert landed == (op == "fsync_dir" and n == 2)     # visible once the manifest was renamed
        assert len(params(path)) == s2.stats()["files"] and tmps(path) == []


def test_enospc_writing_the_manifest_loses_nothing(tmp_path):
    env = FaultEnv()
    path = tmp_path / "s"
    s = SSDStore(path, DIM, rows_per_file=16, options=NOBG, env=env)
    k0 = np.arange(20, dtype=np.uint64)
    s.dump(k0, rows_for(k0))
    before = params(path)
    env.hooks["open_write"] = nth(3, lambda: OSError(errno.ENOSPC, "No space left on device"))
    k1 = np.arange(10, 30, dtype=np.uint64)
    with pytest.raises(DiskFullError):
        s.dump(k1, rows_for(k1, 1))
    assert params(path) == before and not (path / "MANIFEST.tmp").exists()
    np.testing.assert_array_equal(s.load(k0)[0], rows_for(k0))
    env.hooks.clear()
    s.close()
    with SSDStore(path, DIM, options=NOBG) as s2:
        np.testing.assert_array_equal(s2.load(k0)[0], rows_for(k0))
        assert not s2.load(np.arange(20, 30, dtype=np.uint64))[1].any()


def test_enospc_in_compaction_is_typed_and_loses_nothing(tmp_path):
    env = FaultEnv()
    path = tmp_path / "s"
    s = SSDStore(path, DIM, rows_per_file=4, options=NOBG, env=env)
    k = np.arange(8, dtype=np.uint64)
    s.dump(k, rows_for(k))
    s.dump(k[:7], rows_for(k[:7], 1))
    before = params(path)
    env.hooks["write"] = nth(2, lambda: OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(DiskFullError, match="compacting"):
        s.compact()
    env.hooks.clear()
    assert params(path) == before and tmps(path) == []
    want = np.concatenate([rows_for(k[:7], 1), rows_for(k[7:])])
    np.testing.assert_array_equal(s.load(k)[0], want)
    s.compact()
    np.testing.assert_array_equal(s.load(k)[0], want)
    s.close()
    with SSDStore(path, DIM, options=NOBG) as s2:
        np.testing.assert_array_equal(s2.load(k)[0], want)


def test_manifest_lists_exactly_the_files(tmp_path):
    path = tmp_path / "s"
    with SSDStore(path, DIM, rows_per_file=8, options=NOBG) as s:
        for i in range(5):
            k = np.arange(30, dtype=np.uint64)
            s.dump(k, rows_for(k, i))
        s.compact()
        buf = (path / "MANIFEST").read_bytes()
        n = struct.unpack_from("<Q", buf, 24)[0]
        listed = np.frombuffer(buf, "<u8", 2 * n, 32).reshape(n, 2)
        assert sorted(f"{q:016x}.param" for q in listed[:, 0].tolist()) == params(path)
        assert [(path / f"{q:016x}.param").stat().st_size for q in listed[:, 0].tolist()] == listed[:, 1].tolist()
