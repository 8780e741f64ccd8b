"""Keys deduplicated on the device (``hps/train/_device_batch.py``) on Numba's CUDA simulator: with one
rank and no feature that reads keys on the host, the prepare stage uploads each batch's raw arrays once
(``plan``: their bytes, packed) and the place stage makes every mini-batch's plan on the device from
them; only the misses come down (8 B a key). The plans equal the host's, so the job ends with the CPU's
model; where the host path remains (admission, FAE, several ranks), its plans go up with indices in
the smallest dtype that holds them. The same checks (``assert_device_dedup``) run on the jobs of
``test_train_device_cuda_cudasim.py`` and ``test_train_hbm_cache_cudasim.py``: every model and row
optimizer, a table that fits, evictions with SSD-PS spills, and a resumed job."""

from types import SimpleNamespace

import numpy as np
import pytest

from hps.data import Batch
from hps.train._device_backend import DeviceBackend
from hps.train._device_batch import raw_nbytes
from hps.train._feed import LocalBatch
from hps.train._sync import Plan, unique_inverse
from tests.cudasim.test_train_device_cuda_cudasim import assert_device_dedup, assert_same_model, run

pytestmark = pytest.mark.cudasim

#: Arrays of a batch that go up (keys, field, weights, offsets, labels, dense), each padded to 8 bytes.
ARRAYS = 6


def test_a_table_that_fits_trains_like_the_cpu_with_odd_sized_arrays(tmp_path, no_warm_up):
    """Three fields (odd key counts: the packed arrays need alignment), two epochs, deepfm/Adam: the
    plans made on the device equal the host's and the job ends with the CPU's model."""
    args = ["--fields", "3", "--epochs", "2", "--model", "deepfm", "--sparse-optimizer", "adam",
            "--rows", "299"]
    ec, mc = run(tmp_path, "cpu", args)
    eg, mg = run(tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert np.allclose(mg["loss_per_batch"], mc["loss_per_batch"], rtol=1e-5)
    assert_device_dedup(mg, batches=6)
    assert mg["h2d_bytes"]["plan"] > mg["batch_bytes"]  # some array needed padding
    assert mc["device_dedup_batches"] == 0 and mc["batch_bytes"] == 0  # the CPU stages nothing
    assert mc["gpu_paths"] is None and mg["gpu_paths"] == {"launch": "simulator", "gemm": "numpy", "layers": "numpy",
                                                           "dense_step": "ops", "graphs": None}


def test_the_host_path_remains_where_keys_are_needed_on_the_host(tmp_path, no_warm_up):
    """Admission (keys touched on the host) keeps the host's plans: no batch is deduplicated on the
    device, and the job still ends with the CPU's model. (HBM-PS parts on the host path:
    ``test_parts_send_mini_batch_keys_as_positions_within_the_byte_target``.)"""
    args = ["--admit-after", "2"]
    ec, _ = run(tmp_path, "cpu", args)
    eg, mg = run(tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert mg["device_dedup_batches"] == 0 and mg["batch_bytes"] > 0


def _backend(n_dense):
    model = SimpleNamespace(row_params=3, dtype=np.dtype(np.float32), n_dense=n_dense)
    return DeviceBackend(model, np, SimpleNamespace(size=1))


def _local(seed, n=11, n_fields=3, n_dense=2, sizes=(4, 0, 7)):
    rng = np.random.default_rng(seed)
    per = rng.integers(1, 4, n)                             # 1..3 keys an example
    offsets = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
    nnz = int(offsets[-1])
    keys = rng.integers(0, 9, nnz).astype(np.uint64) * np.uint64(2**40 + 3)
    data = Batch(rng.integers(0, 2, n).astype(np.float32), rng.random((n, n_dense), dtype=np.float32), keys,
                 rng.integers(0, n_fields, nnz).astype(np.int32), rng.random(nnz, dtype=np.float32), offsets,
                 n_fields)
    return LocalBatch(data, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))


@pytest.mark.parametrize("seed", range(3))
def test_plans_made_on_the_device_equal_the_uploaded_host_plans(seed):
    """``DeviceBackend.stage_uploaded`` (from the raw arrays ``upload`` sent) gives every mini-batch
    (an empty one too) the plan ``stage`` uploads from the host's ``_sync`` plans, array for array;
    ``upload``'s working set is the host's (first-occurrence order) and costs the raw bytes alone."""
    local = _local(seed)
    plans = []
    for j in range(len(local.bounds) - 1):
        k, inv = unique_inverse(local.minibatch(j).keys)
        plans.append(Plan(k, inv, ukeys=k))
    host = _backend(2).stage(local, plans, None)
    be = _backend(2)
    raw = be.upload(local.data)
    np.testing.assert_array_equal(raw.working_set.keys, unique_inverse(local.data.keys)[0])
    dev = be.stage_uploaded(raw, local.bounds, None)  # one table: no locks to take
    bounds = 8 * len(local.bounds)  # the mini-batches' bounds went up for the rebasing
    assert be.ledger.metrics()["h2d_bytes"]["plan"] - raw_nbytes(local.data) - bounds in range(0, 7 * ARRAYS + 1)
    for h, d in zip(host, dev, strict=True):
        for name in ("keys", "inv", "field", "weights", "offsets", "labels", "dense"):
            a, b = getattr(h, name), getattr(d, name)
            assert a.dtype == b.dtype, name
            np.testing.assert_array_equal(a, b, err_msg=name)
        for name in ("ex", "fld", "wts", "cstart", "cend", "cptr"):
            np.testing.assert_array_equal(getattr(h.bwd, name), getattr(d.bwd, name), err_msg=name)


def test_host_plans_go_up_with_the_smallest_index_dtype_widened_on_the_device():
    """The host path's plan: unique keys (8 B), inverse, offsets and field in the smallest dtype that
    holds them (here 1 B: fewer than 256 keys and fields; int64 / int32 again on the device),
    weights, labels, dense (4 B)."""
    local = _local(7, n_dense=2)
    plans = []
    for j in range(len(local.bounds) - 1):
        k, inv = unique_inverse(local.minibatch(j).keys)
        plans.append(Plan(k, inv, ukeys=k))
    be = _backend(2)
    staged = be.stage(local, plans, None)
    want = 0
    for j, (p, d) in enumerate(zip(plans, staged)):
        b = local.minibatch(j)
        n, nnz = len(b), b.keys.shape[0]
        want += 8 * p.keys.shape[0] + (1 + 1 + 4) * nnz + (n + 1) + 4 * n + 4 * n * 2
        assert d.inv.dtype == d.offsets.dtype == np.int64 and d.field.dtype == np.int32
        np.testing.assert_array_equal(d.inv, p.inv)
        np.testing.assert_array_equal(d.offsets, b.offsets)
        np.testing.assert_array_equal(d.field, b.field)
    m = be.ledger.metrics()
    assert m["h2d_bytes"]["plan"] == want and m["batch_bytes"] == raw_nbytes(local.data)
    assert m["device_dedup_batches"] == 0
