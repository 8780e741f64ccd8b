"""Two ranks under mpiexec training from converted data end with the model of two ranks — and of one
process with --data-shards 2 — training from the source: each rank reads its shard's row groups."""

import json

import pytest

from hps.convert import convert
from hps.train import load_export, main
from tests.test_train_mpi import compare, criteo_args, criteo_file, mpirun

pytestmark = pytest.mark.mpi


def test_two_ranks_on_the_conversion_train_the_source_model(mpiexec, tmp_path):
    src = criteo_file(tmp_path / "train.txt", n=6000)
    out = tmp_path / "conv"
    convert("criteo", src, out, rows_per_file=2000)
    args = criteo_args(src)
    assert main([*args, "--data-shards", "2", "--export", str(tmp_path / "ref"),
                 "--metrics-out", str(tmp_path / "ref.json")]) == 0
    conv_args = [a if a != str(src) else str(out) for a in args]
    conv_args[conv_args.index("criteo")] = "parquet"
    proc = mpirun(mpiexec, 2, [*conv_args, "--export", str(tmp_path / "mpi"), "--metrics-out",
                               str(tmp_path / "mpi.json")])
    assert proc.returncode == 0, proc.stderr
    compare(load_export(tmp_path / "ref", first_order=True), load_export(tmp_path / "mpi", first_order=True), 1e-5)
    ref, mpi = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("ref", "mpi"))
    assert round(ref["auc"], 4) == round(mpi["auc"], 4)
    assert mpi["examples"] == ref["examples"] == 6000
