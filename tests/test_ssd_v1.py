"""Stores written by format version 1 (tests/fixtures/v1-store, made by tests/fixtures/make_v1_store.py
with the version-1 code) open and load correctly, and compaction rewrites them as version 2."""

import shutil
import struct
import threading
from pathlib import Path

import numpy as np
import pytest

from hps.errors import CorruptionError
from hps.ssd import STORE_STRUCT, SSDOptions, SSDStore

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "v1-store"
NOBG = SSDOptions(background=False, io_threads=1)


def rows_for(keys, salt):
    k = np.asarray(keys, dtype=np.float64)[:, None]
    return (k * 10 + np.arange(4) + salt).astype(np.float32)


def expected():
    """What make_v1_store.py dumped, newest value of each key."""
    keys = np.arange(40, dtype=np.uint64)
    want = rows_for(keys, 0)
    want[:22] = rows_for(keys[:22], 1)
    want[16:20] = rows_for(keys[16:20], 2)
    want[3] = rows_for([4], 3)[0]          # key 3 dumped twice in one call: the last occurrence wins
    want[25] = rows_for([25], 3)[0]
    want[30:34] = rows_for(keys[30:34], 4)
    return keys, want


def copy_fixture(tmp_path):
    path = tmp_path / "v1"
    shutil.copytree(FIXTURE, path)
    return path


def test_v1_store_opens_and_loads(tmp_path):
    path = copy_fixture(tmp_path)
    keys, want = expected()
    with SSDStore(path, 4, rows_per_file=8, options=NOBG) as s:
        assert s.stats()["recovered_rows"] == 40 and s.stats()["recovered_files"] == 9
        got, found = s.load(keys)
        assert found.all()
        np.testing.assert_array_equal(got, want)
        assert not s.load(np.array([40, 99], np.uint64))[1].any()
        s.dump(keys[:2], rows_for(keys[:2], 7))            # a v1 store takes new dumps
        want[:2] = rows_for(keys[:2], 7)
    with SSDStore(path, 4, rows_per_file=8, options=NOBG) as s:
        np.testing.assert_array_equal(s.load(keys)[0], want)


def _versions(path):
    return sorted({struct.unpack_from("<H", p.read_bytes(), 8)[0] for p in path.glob("*.param")})


def test_open_upgrades_to_a_manifest_and_compaction_rewrites_v1_files(tmp_path):
    path = copy_fixture(tmp_path)
    keys, want = expected()
    assert _versions(path) == [1]
    with SSDStore(path, 4, rows_per_file=8, options=NOBG) as s:
        assert STORE_STRUCT.unpack((path / "STORE").read_bytes())[1] == 2 and (path / "MANIFEST").exists()
        assert s.compact() == 9                               # every v1 file, stale or not
        assert _versions(path) == [2]
        np.testing.assert_array_equal(s.load(keys)[0], want)
        assert s.stats()["stale_rows"] == 0
    victim = sorted(path.glob("*.param"))[0]
    victim.unlink()                                           # now a lost file is detected
    with pytest.raises(CorruptionError, match=victim.name):
        SSDStore(path, 4, rows_per_file=8, options=NOBG)


def test_v1_to_v2_compaction_concurrent_with_loads_and_dumps(tmp_path):
    """Background compaction rewrites the v1 files while a writer rewrites keys and a reader
    checks that no value ever goes back; then disk rows <= 2x live rows, all files v2."""
    path = copy_fixture(tmp_path)
    keys, want = expected()
    opts = SSDOptions(compact_interval_s=0.001, compact_ratio=1.0)
    errors = []
    with SSDStore(path, 4, rows_per_file=8, options=opts) as s:
        stop = threading.Event()

        def writer():
            rng = np.random.default_rng(3)
            for gen in range(1, 60):
                k = rng.choice(keys, 10, replace=False)
                s.dump(k, np.full((10, 4), 1000 + gen, np.float32))
            stop.set()

        def reader():
            last = np.zeros(40, np.float32)
            while not stop.is_set():
                got, found = s.load(keys)
                bumped = got[:, 0] >= 1000
                if not found.all() or (got[:, 0] < last).any() or (got[bumped] != got[bumped, :1]).any() \
                        or (got[~bumped] != want[~bumped]).any():
                    errors.append("reverted or torn")
                    return
                last = got[:, 0]

        ts = [threading.Thread(target=f) for f in (writer, reader)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        assert not errors
        final = s.load(keys)[0].copy()
        s.compact()
        st = s.stats()
        assert st["compactions"] > 0 and st["live_rows"] + st["stale_rows"] <= 2 * st["live_rows"]
    assert _versions(path) == [2]
    with SSDStore(path, 4, rows_per_file=8, options=NOBG) as s:
        np.testing.assert_array_equal(s.load(keys)[0], final)
