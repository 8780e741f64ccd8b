"""``SSDStore.delete`` is durable: a tombstone file (format 3) hides a deleted key's older copies from a
reopen, whatever compaction merged away meanwhile; compaction merges tombstone files and drops the
entries no row on disk needs any more; a failed delete deletes nothing."""

import errno
import struct

import numpy as np
import pytest

from hps.errors import CorruptionError, DiskFullError, StoreFormatError
from hps.ssd import (FLAG_TOMBSTONES, FORMAT_TOMBSTONES, FORMAT_VERSION, HEADER_STRUCT, MANIFEST_STRUCT, PosixEnv,
                     SSDOptions, SSDStore)
from hps.ssd._format import crc32, pack_manifest, pack_store, unpack_manifest, unpack_store
from tests.reference.store import DictStore

DIM = 4
NOBG = SSDOptions(background=False, io_threads=1)


def rows_of(keys, value):
    return np.full((len(keys), DIM), value, np.float32)


def u64(*keys):
    return np.array(keys, dtype=np.uint64)


def versions_on_disk(path):
    """{file name: (format version, flags)} of every parameter and tombstone file."""
    return {p.name: HEADER_STRUCT.unpack_from(p.read_bytes())[1:5:3] for p in sorted(path.glob("*.param"))}


def test_a_deleted_key_stays_deleted_after_its_newest_copy_is_compacted_away(tmp_path):
    """The review's reproducer: key 0 = 1 beside 99 keys, key 0 = 2 alone, delete key 0, compact
    (the file of the newest copy goes, the older copy stays in a file too little stale to merge),
    reopen: the store served 1."""
    path = tmp_path / "s"
    with SSDStore(path, DIM, options=NOBG) as s:
        s.dump(np.arange(100, dtype=np.uint64), rows_of(range(100), 1))
        s.dump(u64(0), rows_of([0], 2))
        assert s.delete(u64(0, 1000)) == 1
        assert s.compact() == 1
    with SSDStore(path, DIM, options=NOBG) as s:
        rows, found = s.load(u64(0, 1))
        assert found.tolist() == [False, True] and rows[1, 0] == 1 and len(s) == 99


def test_delete_then_dump_then_reopen_serves_the_dump(tmp_path):
    path = tmp_path / "s"
    with SSDStore(path, DIM, rows_per_file=8, options=NOBG) as s:
        s.dump(np.arange(20, dtype=np.uint64), rows_of(range(20), 1))
        s.delete(np.arange(0, 20, 2, dtype=np.uint64))
        s.dump(u64(4, 6), rows_of([4, 6], 3))
        s.delete(u64(6))
    with SSDStore(path, DIM, rows_per_file=8, options=NOBG) as s:
        rows, found = s.load(np.arange(20, dtype=np.uint64))
        assert np.flatnonzero(found).tolist() == sorted([4, *range(1, 20, 2)])
        assert rows[4, 0] == 3 and s.stats()["tombstones"] == 11


@pytest.mark.parametrize("seed", range(4))
def test_random_dumps_deletes_compactions_and_reopens_match_a_dict(tmp_path, seed):
    rng = np.random.default_rng(seed)
    path = tmp_path / "s"
    model = DictStore(DIM)
    opts = SSDOptions(background=False, io_threads=2, stale_fraction=0.3)
    s = SSDStore(path, DIM, rows_per_file=16, options=opts)
    try:
        for step in range(60):
            op = rng.choice(["dump", "delete", "compact", "reopen"], p=[0.5, 0.3, 0.1, 0.1])
            keys = rng.choice(200, size=int(rng.integers(1, 40)), replace=False).astype(np.uint64)
            if op == "dump":
                rows = rng.standard_normal((keys.shape[0], DIM)).astype(np.float32)
                s.dump(keys, rows)
                model.dump(keys, rows)
            elif op == "delete":
                assert s.delete(keys) == model.delete(keys)
            elif op == "compact":
                s.compact()
            else:
                s.close()
                s = SSDStore(path, DIM, rows_per_file=16, options=opts)
            everything = np.arange(200, dtype=np.uint64)
            got, found = s.load(everything)
            want, wfound = model.load(everything)
            np.testing.assert_array_equal(found, wfound, err_msg=f"step {step} ({op})")
            np.testing.assert_array_equal(got, want, err_msg=f"step {step} ({op})")
    finally:
        s.close()


def test_compaction_merges_tombstones_and_drops_the_ones_no_row_needs(tmp_path):
    path = tmp_path / "s"
    with SSDStore(path, DIM, rows_per_file=100, options=NOBG) as s:
        keys = np.arange(1, 201, dtype=np.uint64)
        s.dump(keys, rows_of(keys, 1))
        for i in range(10):                                   # ten tombstone files
            assert s.delete(keys[i * 10:(i + 1) * 10]) == 10
        assert s.stats()["files"] == 12 and s.stats()["tombstones"] == 100
        s.dump(keys[:30], rows_of(keys[:30], 2))              # 30 deleted keys live again
        assert s.compact() == 1 + 9       # the first row file (all stale), ten tombstone files into one
        st = s.stats()                    # the second row file may hold copies of the 70 deleted keys
        assert st["tombstones"] == 70 and st["files"] == 3    # (it is older than their tombstones)
        assert s.compact() == 0                               # nothing more to drop: nothing rewritten
        s.dump(keys, rows_of(keys, 3))                        # every key rewritten: the old files go
        s.compact()
        st = s.stats()
        assert st["tombstones"] == 0 and st["live_rows"] == 200 and st["stale_rows"] == 0
    with SSDStore(path, DIM, rows_per_file=100, options=NOBG) as s:
        rows, found = s.load(keys)
        assert found.all() and (rows == 3).all()


def test_a_merged_file_reads_the_index_before_a_delete_commits_and_keeps_its_tombstone(tmp_path):
    """A delete that lands while compaction reads a victim's rows (after it found them live): the
    merged file holds the deleted key's copy, so its tombstone must outlive the next tombstone merge."""
    path = tmp_path / "s"
    store = []

    class DeleteDuringRead(PosixEnv):
        armed = False

        def read_many(self, *args):           # compaction's row reads (not the native path: overridden)
            if self.armed:
                self.armed = False
                assert store[0].delete(u64(5)) == 1
            return super().read_many(*args)

    env = DeleteDuringRead()
    others = np.array([1, 2, 3, 4, 6, 7, 8, 9], dtype=np.uint64)
    with SSDStore(path, DIM, rows_per_file=10, options=NOBG) as s:
        s.dump(np.arange(10, dtype=np.uint64), rows_of(range(10), 1))
        s.dump(others, rows_of(others, 2))                    # the first file: 0 and 5 live, 80 % stale
    with SSDStore(path, DIM, rows_per_file=10, options=NOBG, env=env) as s:
        store.append(s)                                       # reopened: the delete takes the next
        env.armed = True                                      # sequence number, the horizon's own
        assert s.compact() == 1                               # 0 and 5 merged; 5 deleted meanwhile
        assert not env.armed and s.contains(u64(0, 5)).tolist() == [True, False]
        s.dump(others, rows_of(others, 3))                    # every other file newer than the delete
        s.compact()                                           # (the merged one holds 5, half stale)
        assert s.stats()["tombstones"] == 1
    with SSDStore(path, DIM, rows_per_file=10, options=NOBG) as s:
        found = s.load(np.arange(10, dtype=np.uint64))[1]
        assert np.flatnonzero(found).tolist() == [0, *others.tolist()]


@pytest.mark.parametrize("at", ["write", "rename"])
def test_a_failed_delete_deletes_nothing(tmp_path, at):
    class Full(PosixEnv):
        fail = False

        def write(self, handle, data):
            if self.fail and at == "write":
                raise OSError(errno.ENOSPC, "No space left on device")
            super().write(handle, data)

        def rename(self, src, dst):
            if self.fail and at == "rename" and dst.endswith("MANIFEST"):
                raise OSError(errno.EIO, "I/O error")
            super().rename(src, dst)

    env = Full()
    path = tmp_path / "s"
    with SSDStore(path, DIM, options=NOBG, env=env) as s:
        s.dump(np.arange(10, dtype=np.uint64), rows_of(range(10), 1))
        before = sorted(p.name for p in path.iterdir())
        env.fail = True
        with pytest.raises(DiskFullError if at == "write" else OSError):
            s.delete(u64(1, 2))
        assert sorted(p.name for p in path.iterdir()) == before
        assert s.contains(u64(1, 2)).all() and s.stats()["tombstones"] == 0
        env.fail = False
        assert s.delete(u64(1, 2)) == 2
    with SSDStore(path, DIM, options=NOBG) as s:
        assert len(s) == 8


def test_only_a_store_that_deleted_has_format_3_files_and_a_damaged_one_is_refused(tmp_path):
    path = tmp_path / "s"
    with SSDStore(path, DIM, options=NOBG) as s:
        s.dump(np.arange(10, dtype=np.uint64), rows_of(range(10), 1))
        s.delete(u64(10))                                     # not in the store: no file
        assert set(versions_on_disk(path).values()) == {(FORMAT_VERSION, 0)}   # format-2 readers read it
        s.delete(u64(3, 4))
    found = versions_on_disk(path)
    tomb = [name for name, v in found.items() if v == (FORMAT_TOMBSTONES, FLAG_TOMBSTONES)]
    assert len(found) == 2 and len(tomb) == 1
    f = path / tomb[0]
    assert f.stat().st_size == 64 + 16                       # a header and two keys
    buf = bytearray(f.read_bytes())
    buf[70] ^= 1                                              # a key
    f.write_bytes(bytes(buf))
    with pytest.raises(CorruptionError, match="keys section checksum"):
        SSDStore(path, DIM, options=NOBG)


def test_compact_with_nothing_to_drop_is_no_compaction(tmp_path):
    with SSDStore(tmp_path / "s", DIM, options=NOBG) as s:
        s.dump(np.arange(10, dtype=np.uint64), rows_of(range(10), 1))
        s.delete(u64(1))
        for _ in range(3):
            assert s.compact() == 0
        assert s.stats()["compactions"] == 0 and s.stats()["tombstones"] == 1


def test_a_newer_store_descriptor_or_manifest_is_refused():
    """Version 3 is a tombstone file's: a descriptor or a manifest of version 3 is not this reader's."""
    with pytest.raises(StoreFormatError, match="newer than this reader"):
        unpack_store(pack_store(1, DIM, version=FORMAT_TOMBSTONES), "STORE")
    body = bytearray(pack_manifest(1, np.zeros((0, 2), np.uint64))[:-4])
    MANIFEST_STRUCT.pack_into(body, 0, b"HPSMANIF", FORMAT_TOMBSTONES, 1, 0)
    with pytest.raises(StoreFormatError, match="newer than this reader"):
        unpack_manifest(bytes(body) + struct.pack("<I", crc32(bytes(body))), "MANIFEST")
