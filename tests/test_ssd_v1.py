"""Stores written by format version 1 (tests/fixtures/v1-store, made by tests/fixtures/make_v1_store.py
with the version-1 code) open and load correctly, and compaction rewrites them as version 2."""

import shutil
from pathlib import Path

import numpy as np

from hps.ssd import SSDOptions, SSDStore

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
