"""Running out of space on a real file system while checkpointing or exporting: one line
(DiskFullError), not h5py's "Exception ignored in ... ObjectID.__dealloc__" tracebacks, and nothing
left behind. The file system is a small tmpfs mounted in a private mount namespace (``unshare``);
the test skips where the machine does not allow that."""

import errno
import gc
import io
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from hps.formats._h5out import _GuardedFile, h5_output
from tests.test_train import SMALL

#: Sizes of the small file system: SMALL's checkpoints take 1.6 MB each (one fits, not two beside
#: each other); its export 0.3 MB, after a 1.6 MB scratch file of every row.
CHECKPOINT_FS, EXPORT_FS = "2500k", "900k"


def _run_on_small_fs(tmp_path, size, *flags):
    """Run ``python -m hps.train`` with a tmpfs of ``size`` mounted at tmp_path/"full" (a private
    mount namespace; ``{mnt}`` in ``flags`` names it) -> CompletedProcess; skips where no namespace
    or mount is allowed."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here")
    mnt = tmp_path / "full"
    mnt.mkdir()
    probe = subprocess.run([unshare, "-Urm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {mnt}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {probe.stderr.strip()}")
    args = " ".join([sys.executable, "-m", "hps.train", *SMALL, *flags]).replace("{mnt}", str(mnt))
    return subprocess.run([unshare, "-Urm", "sh", "-c",
                           f"mount -t tmpfs -o size={size} tmpfs {mnt} && exec {args}"],
                          capture_output=True, text=True, timeout=600)


def test_a_full_disk_while_checkpointing_is_one_line(tmp_path):
    proc = _run_on_small_fs(tmp_path, CHECKPOINT_FS, "--checkpoint-dir", "{mnt}/ck", "--checkpoint-every", "1")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    assert "DiskFullError" in proc.stderr and "no space left on the device while writing checkpoint ckpt-00000001" in proc.stderr
    assert f"the previous checkpoint {tmp_path / 'full' / 'ck' / 'ckpt-00000000'} is intact" in proc.stderr


def test_a_full_disk_while_exporting_is_one_line(tmp_path):
    proc = _run_on_small_fs(tmp_path, EXPORT_FS, "--export", "{mnt}/model")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Exception ignored" not in proc.stderr, proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    assert "[Errno 28] no space left on the device while writing the export" in proc.stderr


class _FullAfter(io.FileIO):
    """A file on a device with ``room`` bytes left (for everything written through this class)."""

    room = 0

    def write(self, b):
        n = memoryview(b).nbytes
        if n > _FullAfter.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        _FullAfter.room -= n
        return super().write(b)


@pytest.mark.parametrize("room", [0, 3000, 100_000, 700_000, 1_500_000])
def test_h5_output_raises_the_first_failed_write_after_closing_the_file(tmp_path, monkeypatch, capfd, room):
    """The device fills up at some point of writing (creating the file, a data chunk, the flush of
    close): the call raises that OSError once; HDF5 closed the file (no object left open, no
    descriptor, no dealloc noise)."""
    monkeypatch.setattr(_FullAfter, "room", room)
    monkeypatch.setattr(_GuardedFile, "_raw", _FullAfter)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    with pytest.raises(OSError) as info:
        with h5_output(tmp_path / "x.h5") as h:
            rows = h.create_dataset("rows", shape=(0, 16), maxshape=(None, 16), dtype=np.float32, chunks=(1024, 16))
            for a in range(0, 30_000, 3_000):
                rows.resize((a + 3_000, 16))
                rows[a:] = np.full((3_000, 16), a, np.float32)
            h.create_group("more").attrs["x"] = 1
    assert info.value.errno == errno.ENOSPC and "HDF5" not in str(info.value)
    gc.collect()
    assert "Exception ignored" not in capfd.readouterr().err
    assert [i for i in h5py.h5f.get_obj_ids(h5py.h5f.OBJ_ALL, h5py.h5f.OBJ_ALL) if not isinstance(i, h5py.h5t.TypeID)] == []
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) == fds


def test_h5_output_round_trips(tmp_path):
    data = np.arange(48, dtype=np.float32).reshape(12, 4)
    with h5_output(tmp_path / "x.h5") as h:
        h.create_dataset("rows", data=data)
    with h5_output(tmp_path / "x.h5", "a") as h:
        h.attrs["more"] = 1
    with h5py.File(tmp_path / "x.h5", "r") as h:
        np.testing.assert_array_equal(h["rows"][()], data)
        assert h.attrs["more"] == 1
