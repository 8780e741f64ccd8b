"""Checkpoint verification under mpiexec: each rank checks its own shard, the ranks agree on the
checkpoint to resume from, and a fallback ends with exactly the uninterrupted run's model."""

import json
import shutil

import pytest

from hps.train import load_export
from tests.test_train_mpi import SMALL, compare, mpirun

pytestmark = pytest.mark.mpi


def test_one_damaged_shard_makes_every_rank_fall_back(mpiexec, tmp_path):
    ck = tmp_path / "ck"
    full = mpirun(mpiexec, 2, [*SMALL, "--epochs", "2", "--export", str(tmp_path / "full")])
    assert full.returncode == 0, full.stderr[-2000:]
    first = mpirun(mpiexec, 2, [*SMALL, "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                                "--keep-checkpoints", "2"])
    assert first.returncode == 0, first.stderr[-2000:]
    newest, older = ck / "ckpt-00000005", ck / "ckpt-00000003"
    meta = json.loads((newest / "meta.json").read_text())
    assert sorted(meta["files"]) == ["dense.h5", "model.json", "sparse-rank0-of-2.h5", "sparse-rank1-of-2.h5"]
    shard = newest / "sparse-rank1-of-2.h5"  # only rank 1 reads it
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    kept = tmp_path / "kept"
    shutil.copytree(ck, kept)

    resumed = mpirun(mpiexec, 2, [*SMALL, "--epochs", "2", "--checkpoint-dir", str(ck), "--resume",
                                  "--export", str(tmp_path / "resumed")])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"{shard} failed its check on rank 1" in resumed.stdout
    assert f"resumed from {older} (after batch 3" in resumed.stdout
    compare(load_export(tmp_path / "full"), load_export(tmp_path / "resumed"), 0.0)

    shutil.rmtree(kept / "ckpt-00000003")  # no older checkpoint: every rank stops, naming the shard
    failed = mpirun(mpiexec, 2, [*SMALL, "--epochs", "2", "--checkpoint-dir", str(kept), "--resume"])
    assert failed.returncode != 0
    assert "sparse-rank1-of-2.h5" in failed.stderr and "no older intact checkpoint" in failed.stderr
    assert "Traceback" not in failed.stderr
