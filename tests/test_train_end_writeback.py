"""The end of a training job writes the HBM-PS's rows back only for a reader of the store: ``--export``
(and ``Trainer.export`` after ``fit``) and ``--keep-ssd``. A job without either counts its model size
over the three tiers without writing a row, and ends with the same ``table_rows`` as one that exports."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hps.cli import parse_config
from hps.ssd import SSDStore
from hps.train import load_export, main
from hps.train._trainer import Trainer
from tests.budgets import SPILL, resolve_spill
from tests.test_train_mpi import mpirun

# a table of ~25,000 keys, an HBM-PS of 2,048 rows of 64 B (8 embedding + 8 Adagrad columns): rows are
# evicted to the MEM-PS, where they stay dirty, and come back in the second epoch
EVICTING = ["--rows", "40000", "--fields", "4", "--vocab-per-field", "20000", "--batch-size", "1024",
            "--minibatch-size", "256", "--hidden", "16,8", "--embedding-dim", "8", "--no-progress",
            "--hbm-budget", "500KiB", "--rows-per-file", "64", "--epochs", "2"]
TABLE_KEYS = 25_000


@pytest.fixture(scope="module")
def spilling():
    """EVICTING with the smallest MEM-PS tier the job accepts (one batch's working set beside the SSD-PS
    index): evicted rows spill to the SSD-PS during training."""
    return resolve_spill([*EVICTING, "--mem-budget", SPILL], lambda a: subprocess.run(
        [sys.executable, "-m", "hps.train", *a], capture_output=True, text=True, timeout=300), 1.3 * TABLE_KEYS)


def run(tmp_path, name, argv, capsys, export=True):
    """The CLI job ``argv`` -> (metrics, its "model size" line, its export or None)."""
    out, metrics = tmp_path / name, tmp_path / f"{name}.json"
    assert main([*argv, "--metrics-out", str(metrics), *(["--export", str(out)] if export else [])]) == 0
    size = [line for line in capsys.readouterr().out.splitlines() if line.startswith("model size:")]
    return json.loads(metrics.read_text()), size, load_export(out) if export else None


def same_export(a, b):
    """Bit-identical exports (keys in any order)."""
    (ka, va, da), (kb, vb, db) = a, b
    oa, ob = np.argsort(ka), np.argsort(kb)
    np.testing.assert_array_equal(ka[oa], kb[ob])
    np.testing.assert_array_equal(va[oa], vb[ob])
    assert da.keys() == db.keys() and all(np.array_equal(da[k], db[k]) for k in da)


@pytest.mark.parametrize("job", ["evicting", "spilling"])
def test_a_job_without_export_reports_the_model_size_of_one_with_export_and_writes_less(tmp_path, capsys,
                                                                                        spilling, job):
    argv = EVICTING if job == "evicting" else spilling
    m_exp, size_exp, model = run(tmp_path, "exp", argv, capsys)
    m, size, _ = run(tmp_path, "plain", argv, capsys, export=False)
    assert m["hbm_evicted_rows"] > 0 and max(m["resident_rows"]) < m["table_rows"]  # rows left the HBM-PS
    if job == "spilling":  # and the MEM-PS: the SSD-PS took rows during training
        assert m["ssd_bytes_written"] > 0 and m["ssd_bytes_read"] > 0
    # every key the model holds, counted without writing the resident rows back
    assert m["table_rows"] == m_exp["table_rows"] == model[0].shape[0]
    assert m["sparse_parameters"] == m_exp["sparse_parameters"] and size == size_exp
    assert m["loss_per_batch"] == m_exp["loss_per_batch"]
    # the export wrote every resident row (and the MEM-PS's dirty ones) to the SSD-PS; the plain job did not
    assert m["ssd_bytes_written"] < m_exp["ssd_bytes_written"]


def test_trainer_export_after_fit_is_the_export_of_the_cli(tmp_path, capsys, spilling):
    """A library user's ``fit`` then ``export``: the export writes the resident rows back first."""
    _, _, model = run(tmp_path, "cli", spilling, capsys)
    t = Trainer(parse_config(spilling), log=lambda *a, **k: None)
    try:
        m = t.fit()
        assert t.hier.resident > 0  # fit left rows in the HBM-PS
        t.export(str(tmp_path / "lib"))
        assert t.hier.resident == 0
    finally:
        t.close()
    assert m["table_rows"] == model[0].shape[0]
    same_export(model, load_export(tmp_path / "lib"))


@pytest.mark.parametrize("expiry", [[], ["--expire-after", "20"]], ids=["all", "expiry"])  # 20: after they spilled
def test_keep_ssd_keeps_a_store_holding_every_row(tmp_path, capsys, spilling, expiry):
    """... and, with expiry, none of the keys it deleted, though their rows had spilled to it."""
    _, _, (keys, values, _) = run(tmp_path, "exp", [*spilling, *expiry], capsys)
    ssd = tmp_path / "ssd"
    m, _, _ = run(tmp_path, "kept", [*spilling, *expiry, "--ssd-path", str(ssd), "--keep-ssd"], capsys,
                  export=False)
    assert (m.get("expired_keys", 0) > 0) == bool(expiry)
    with SSDStore(ssd / "rank0-of-1" / "store", dim=16) as s:
        got = [(k, r) for k, r in s.iter_rows()]
    sk, sr = np.concatenate([k for k, _ in got]), np.concatenate([r for _, r in got])
    assert sk.shape[0] == m["table_rows"] == keys.shape[0]
    oa, ob = np.argsort(keys), np.argsort(sk)
    np.testing.assert_array_equal(keys[oa], sk[ob])
    np.testing.assert_array_equal(values[oa], sr[ob, :values.shape[1]])


@pytest.mark.mpi
@pytest.mark.parametrize("sync", [[], ["--sparse-sync", "allreduce"]])  # allreduce: replicas of others' rows
def test_two_ranks_without_export_report_the_model_size_of_two_with_export(mpiexec, tmp_path, sync):
    argv = resolve_spill([*EVICTING, *sync, "--epochs", "1", "--ranks-per-node", "2", "--mem-budget", SPILL],
                         lambda a: mpirun(mpiexec, 2, a), 1.3 * TABLE_KEYS / 2)
    ms = {}
    for name, extra in (("exp", ["--export", str(tmp_path / "model")]), ("plain", [])):
        proc = mpirun(mpiexec, 2, [*argv, *extra, "--metrics-out", str(tmp_path / f"{name}.json")])
        assert proc.returncode == 0, proc.stderr[-3000:]
        ms[name] = json.loads((tmp_path / f"{name}.json").read_text())
        ms[name]["size_line"] = [line for line in proc.stdout.splitlines() if line.startswith("model size:")]
    exp, plain = ms["exp"], ms["plain"]
    assert plain["hbm_evicted_rows"] > 0 and plain["ssd_bytes_written"] > 0  # evicted, and spilled
    assert plain["table_rows"] == exp["table_rows"] == load_export(tmp_path / "model")[0].shape[0]
    assert plain["size_line"] == exp["size_line"] and plain["loss_per_batch"] == exp["loss_per_batch"]
    assert plain["ssd_bytes_written"] < exp["ssd_bytes_written"]


def test_rows_after_flush_counts_what_a_push_and_flush_would_leave_in_the_store(tmp_path):
    """``MemPS.rows_after_flush``: the store's keys, the dirty cached ones and the held ones it lacks,
    overlaps counted once; then the push and flush it stands for leave exactly that many."""
    from hps.mem import MemPS, RowInitializer

    rng = np.random.default_rng(0)
    with SSDStore(tmp_path / "s", dim=4, rows_per_file=16) as store:
        mem = MemPS(store, 4, initializer=RowInitializer(2, 4), capacity_rows=32)
        rows = lambda k: rng.random((k.shape[0], 4), dtype=np.float32)  # noqa: E731
        first = np.arange(0, 60, dtype=np.uint64)         # more than the cache: some spill to the store
        mem.push(first, rows(first))
        again = np.arange(50, 70, dtype=np.uint64)        # dirty again in the cache, some already stored
        mem.push(again, rows(again))
        held = np.arange(10, 90, 3, dtype=np.uint64)      # the tier above: stored, dirty and new keys
        assert len(store) > 0 and mem.cache.dirty_rows(rows=False)[0].shape[0] > 0
        assert store.contains(held).any() and not store.contains(held).all()
        n = mem.rows_after_flush(held)
        assert len(store) < n == np.union1d(np.union1d(first, again), held).shape[0]
        mem.push(held, rows(held))
        mem.flush()
        assert len(store) == n
