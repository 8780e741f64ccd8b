"""Hierarchical Training (seeds/002 §3) under mpiexec: --dense-sync easgd with --groups, --compress.

- the EASGD mechanism against a serial NumPy EASGD (tests/mpi/check_easgd.py: groups of N/2 and of
  1, checkpoint state restored mid-run, bf16 rounds);
- G = 1 is the allreduce job bit for bit, and --compress none leaves every byte and bit as it was;
- bf16 halves the bytes of every compressed kind, int8 rows take d + 2 bytes instead of 4 d;
- G = #ranks (plain EASGD per rank) trains, and a resumed run continues exactly.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hps.train import load_export

from .test_train_mpi import SMALL, compare, mpirun

pytestmark = pytest.mark.mpi
ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("n", [2, 4])
def test_easgd_rounds_match_a_serial_easgd(mpiexec, n):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([mpiexec, "-n", str(n), sys.executable, str(ROOT / "tests/mpi/check_easgd.py")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"check_easgd: OK on {n} ranks" in proc.stdout


def _train(mpiexec, tmp_path, name, n, extra, args=SMALL):
    out = tmp_path / name
    out.mkdir()
    proc = mpirun(mpiexec, n, [*args, *extra, "--export", str(out / "model"), "--metrics-out", str(out / "m.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_export(out / "model"), json.loads((out / "m.json").read_text())


def test_one_group_is_the_allreduce_job_and_compress_none_changes_nothing(mpiexec, tmp_path):
    ref, mref = _train(mpiexec, tmp_path, "allreduce", 2, [])
    one, mone = _train(mpiexec, tmp_path, "easgd-1", 2, ["--dense-sync", "easgd", "--groups", "1",
                                                         "--compress", "none"])
    compare(ref, one, 0.0)
    assert mone["groups"] == 1 and mone["easgd_rounds"] == 0 and mone["dense_sync"] == "easgd"
    assert mone["bytes_sent"] == mref["bytes_sent"] and mone["auc"] == mref["auc"]


@pytest.fixture(scope="module")
def bytes_runs(mpiexec, tmp_path_factory):
    """2 ranks, embedding width 16: metrics of --compress none, bf16, int8."""
    tmp = tmp_path_factory.mktemp("compress")
    args = [a if a != "8" else "16" for a in SMALL]  # --embedding-dim 16
    return {mode: _train(mpiexec, tmp, mode, 2, ["--compress", mode], args) for mode in ("none", "bf16", "int8")}


def test_bf16_halves_every_compressed_kind_and_int8_rows_take_d_plus_2_bytes(bytes_runs):
    none, bf16, int8 = (bytes_runs[m][1]["bytes_sent"] for m in ("none", "bf16", "int8"))
    for kind in ("dense_allreduce", "sparse_rows", "sparse_grads"):
        assert none[kind] > 0
        assert abs(bf16[kind] / none[kind] - 0.5) < 0.01, kind  # padding of the bf16 all-reduce aside
    assert bf16["sparse_keys"] == none["sparse_keys"]          # keys are never compressed
    assert int8["sparse_rows"] * 4 * 16 == none["sparse_rows"] * (16 + 2)
    assert int8["sparse_grads"] == bf16["sparse_grads"] and int8["dense_allreduce"] == bf16["dense_allreduce"]
    (_, _, dn), (_, _, db) = bytes_runs["none"][0], bytes_runs["bf16"][0]
    assert max(np.abs(dn[k] - db[k]).max() for k in dn) > 0      # bf16 did round something
    for mode in ("bf16", "int8"):
        assert abs(bytes_runs[mode][1]["auc"] - bytes_runs["none"][1]["auc"]) < 0.02


def test_groups_of_one_rank_train_and_resume_exactly(mpiexec, tmp_path):
    """G = #ranks: plain EASGD per rank. Checkpoints keep each rank's copy, optimizer state, pending
    difference and the centre: epoch 1 + resume = two epochs in one run, exactly."""
    ea = ["--dense-sync", "easgd", "--groups", "2", "--easgd-every", "3"]
    full, m = _train(mpiexec, tmp_path, "full", 2, [*ea, "--epochs", "2"])
    assert m["groups"] == 2 and m["easgd_rounds"] > 0 and m["bytes_sent"]["dense_easgd"] > 0
    assert m["bytes_sent"]["dense_allreduce"] == 0        # groups of one rank: nothing to all-reduce
    ck = str(tmp_path / "ck")
    _train(mpiexec, tmp_path, "first", 2, [*ea, "--epochs", "1", "--checkpoint-dir", ck])
    resumed, _ = _train(mpiexec, tmp_path, "resumed", 2, [*ea, "--epochs", "2", "--checkpoint-dir", ck, "--resume"])
    compare(full, resumed, 0.0)
    wrong = mpirun(mpiexec, 2, [*SMALL, "--epochs", "2", "--checkpoint-dir", ck, "--resume"])
    assert wrong.returncode != 0 and "resume with the same" in wrong.stderr


def test_two_groups_of_two_train_a_model(mpiexec, tmp_path):
    ref, mref = _train(mpiexec, tmp_path, "allreduce", 4, ["--ranks-per-node", "2"])
    got, m = _train(mpiexec, tmp_path, "g2", 4, ["--ranks-per-node", "2", "--dense-sync", "easgd", "--groups", "2",
                                                  "--compress", "bf16"])
    assert m["groups"] == 2 and m["bytes_sent"]["dense_easgd"] > 0 and m["bytes_sent"]["dense_allreduce"] > 0
    assert abs(m["auc"] - mref["auc"]) < 0.03
    compare(ref[:2] + ({},), got[:2] + ({},), 0.5)  # same keys; rows close


def test_option_errors_are_one_clear_line():
    from hps.config import Config
    from hps.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="--groups 2 needs --dense-sync easgd"):
        Config.from_flat({"groups": 2})
    with pytest.raises(InvalidInputError, match="easgd-alpha x groups"):
        Config.from_flat({"dense_sync": "easgd", "groups": 4, "easgd_alpha": 0.5})
    with pytest.raises(InvalidInputError, match="compress must be one of"):
        Config.from_flat({"compress": "fp8"})
    assert Config.from_flat({"dense_sync": "easgd", "groups": 3}).train.easgd_alpha is None  # 0.9 / G


def test_one_process_refuses_groups_instead_of_training_one_copy(capsys):
    """One process holds one dense copy whatever --data-shards says: --groups there would silently
    train the allreduce job."""
    from hps.train import main

    assert main([*SMALL, "--data-shards", "4", "--dense-sync", "easgd", "--groups", "2"]) == 2
    assert "--groups 2 needs 2 or more MPI ranks" in capsys.readouterr().err


def test_one_dense_copy_is_never_a_silent_fallback_for_groups():
    """The dense sync owns "--groups G needs G ranks": one process asking for groups is refused there,
    not quietly given the allreduce job's one dense copy; the warm-up's one-process scratch job asks
    for one group (its warm-up form), so it is never refused."""
    from hps.config import Config, Scratch, scratch_config
    from hps.errors import InvalidInputError
    from hps.model._dense_optim import DenseAdam
    from hps.train._backend import HostBackend
    from hps.train._collectives import Collectives
    from hps.train._easgd import make_dense_sync

    params = {"w": np.zeros((3, 4), np.float32)}
    with pytest.raises(InvalidInputError, match="--groups 2 needs 2 or more MPI ranks"):
        make_dense_sync("easgd", Collectives(), params, DenseAdam(0.1), HostBackend(None), groups=2)
    cfg = Config.from_flat({"dense_sync": "easgd", "groups": 2})
    assert scratch_config(cfg, Scratch(32, 1 << 30, 1 << 20)).train.groups == 1


def test_groups_must_divide_the_ranks(mpiexec):
    proc = mpirun(mpiexec, 2, [*SMALL, "--dense-sync", "easgd", "--groups", "3"], timeout=120)
    assert proc.returncode == 2 and "--groups 3 must divide the number of ranks (2)" in proc.stderr
