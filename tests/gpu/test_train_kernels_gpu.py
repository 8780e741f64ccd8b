"""GPU-resident training kernels on a real GPU (skips itself without one): CuPy arrays zero-copy, a
CuPy stream, real atomics under contention, sizes the simulator cannot run; against the CPU twins.
On a GPU, NVVM may fuse multiply-adds, so float results agree to a few ulp, not bit for bit; sums made
with float atomics agree to what their addition order can change (:func:`atomic_sum_bound`)."""

import numpy as np
import pytest

from hps import HashTable
from hps.gpu import TransferLedger
from hps.gpu import _row_ops as rops
from hps.gpu import _train_ops as ops
from hps.model import SparseAdagrad, SparseSGD
from hps.model import _kernels as cpu
from hps.model._base import _sigmoid

pytestmark = pytest.mark.gpu


def cupy():
    return pytest.importorskip("cupy")


def zipf_plan(rng, n, n_fields, vocab, max_keys=3):
    """CSR plan of n examples with Zipf keys (many duplicates), as the trainer builds it."""
    counts = rng.integers(0, max_keys + 1, (n, n_fields))
    field = np.repeat(np.tile(np.arange(n_fields, dtype=np.int32), n), counts.ravel())
    nnz = field.shape[0]
    keys = (field.astype(np.uint64) << np.uint64(40)) | np.minimum(rng.zipf(1.2, nnz), vocab).astype(np.uint64)
    offsets = np.concatenate([[0], np.cumsum(counts.sum(axis=1))]).astype(np.int64)
    uniq, inv = np.unique(keys, return_inverse=True)
    weights = rng.uniform(0.5, 2.0, nnz).astype(np.float32)
    return uniq, dict(inv=inv.astype(np.int64), field=field, weights=weights, offsets=offsets)


def atomic_sum_bound(g_pooled, plan, u, dtype=np.float32):
    """Per (key, column) bound on how far two float sums of the same products may differ when only the
    order of the additions changes (``cuda.atomic.add`` from many examples lands in any order): each
    order's sum of n products lies within gamma_(n+1) * sum(|product|) of the exact sum (Higham,
    "Accuracy and Stability of Numerical Algorithms", 2nd ed., Sec. 4.2; n - 1 additions plus the
    rounding of each product, or none when it is fused), so two orders differ by at most twice that,
    with gamma_m = m u / (1 - m u) and u = 2**-24 for float32. Relative to the magnitude of the
    summands, not of the sum: a key whose products nearly cancel may differ far more than rtol allows
    relative to its (small) sum, and that is still correct."""
    mags = np.zeros((u, g_pooled.shape[1] // (plan["field"].max() + 1)), np.float64)
    cpu.pool_fields_backward(np.abs(g_pooled).astype(np.float64), plan["inv"], plan["field"],
                             np.abs(plan["weights"]).astype(np.float64), plan["offsets"], mags)
    n = np.bincount(plan["inv"], minlength=u).astype(np.float64)[:, None]
    unit = np.finfo(dtype).eps / 2
    gamma = (n + 1) * unit / (1 - (n + 1) * unit)
    return 2 * gamma * mags + np.finfo(dtype).tiny


@pytest.mark.parametrize("opt", [SparseSGD(0.05), SparseAdagrad(0.05, initial_accumulator=0.1)],
                         ids=["sgd", "adagrad"])
def test_minibatch_step_matches_cpu_at_scale(opt):
    cp = cupy()
    rng = np.random.default_rng(0)
    n, n_fields, d = 4096, 8, 32
    keys, plan = zipf_plan(rng, n, n_fields, vocab=5000)
    u = keys.shape[0]
    rows = opt.init_rows(rng.normal(scale=0.1, size=(u, d)).astype(np.float32))
    table = HashTable(2 * u, rows.shape[1], device="cuda")
    table.insert(keys, rows)
    g_pooled = rng.normal(size=(n, n_fields * d)).astype(np.float32)

    pooled_cpu = np.zeros((n, n_fields * d), np.float32)
    cpu.pool_fields(np.ascontiguousarray(rows[:, :d]), plan["inv"], plan["field"], plan["weights"],
                    plan["offsets"], pooled_cpu)
    g_cpu = np.zeros((u, d), np.float32)
    cpu.pool_fields_backward(g_pooled, plan["inv"], plan["field"], plan["weights"], plan["offsets"], g_cpu)

    stream = cp.cuda.Stream(non_blocking=False)
    dplan = {k: cp.asarray(v) for k, v in plan.items()}
    d_keys = cp.asarray(keys)
    slots = cp.empty(u, cp.int64)
    pooled = cp.empty((n, n_fields * d), cp.float32)
    grads = cp.empty((u, d), cp.float32)
    scalars = ops.BatchScalars()
    with table.device_view() as v:
        ops.find_slots_async(v, d_keys, slots, scalars.missing, stream=stream)
        ops.pool_forward_async(v, slots, out=pooled, width=d, stream=stream, **dplan)
        ops.pool_backward_async(cp.asarray(g_pooled), grads=grads, stream=stream, **dplan)
        rops.sparse_update_async(v, slots, grads, opt, stream=stream)
        stream.synchronize()
    np.testing.assert_allclose(pooled.get(), pooled_cpu, rtol=1e-5, atol=1e-6)
    # 232,832 sums of up to hundreds of atomic adds each: compare within what reordering may change
    g_gpu = grads.get()
    err = np.abs(g_gpu.astype(np.float64) - g_cpu)
    bound = atomic_sum_bound(g_pooled, plan, u)
    assert (err <= bound).all(), f"{int((err > bound).sum())} gradients beyond the reordering bound"
    got, found = table.get(keys)
    assert found.all()
    # the row update itself, from the GPU's own sums (FMA contraction only)
    np.testing.assert_allclose(got, opt.apply(rows, g_gpu), rtol=1e-5, atol=1e-7)
    assert scalars.read(TransferLedger(cp))["missing"] == 0


def test_pool_backward_contention_closed_form():
    """Every occurrence is the same key: 2**16 atomic adds onto one row, integer-valued, exact."""
    cp = cupy()
    n, reps, p = 1 << 14, 4, 8
    inv = cp.zeros(n * reps, cp.int64)
    field = cp.zeros(n * reps, cp.int32)
    weights = cp.full(n * reps, 2.0, cp.float32)
    offsets = cp.arange(0, n * reps + 1, reps, dtype=cp.int64)
    g = cp.ones((n, p), cp.float32)
    grads = cp.empty((1, p), cp.float32)
    ops.pool_backward_async(g, inv, field, weights, offsets, grads)
    cp.cuda.runtime.deviceSynchronize()
    assert (grads.get() == 2.0 * n * reps).all()


def test_bce_loss_grad_on_cupy():
    cp = cupy()
    rng = np.random.default_rng(1)
    n = 100_000
    z = rng.normal(scale=4, size=n).astype(np.float32)
    y = rng.integers(0, 2, n).astype(np.float32)
    dz = cp.empty(n, cp.float32)
    scalars = ops.BatchScalars()
    ops.bce_loss_grad_async(cp.asarray(z), cp.asarray(y), n, dz, scalars.loss)
    led = TransferLedger(cp)
    loss = scalars.read(led)["loss"]
    np.testing.assert_allclose(dz.get(), (_sigmoid(np, z) - y) / np.float32(n), rtol=1e-5, atol=1e-10)
    z64 = z.astype(np.float64)
    assert loss == pytest.approx((np.maximum(z64, 0) - y * z64 + np.log1p(np.exp(-np.abs(z64)))).sum(), rel=1e-9)
    assert led.metrics()["d2h_bytes"]["minibatch"] == 16


def test_table_growth_and_purge_on_the_gpu():
    rng = np.random.default_rng(2)
    table = HashTable(1 << 16, 16, device="cuda")
    cpu_table = HashTable(1 << 16, 16)
    keys = rng.integers(0, 2**63, 1 << 16, dtype=np.uint64)
    rows = rng.normal(size=(1 << 16, 16)).astype(np.float32)
    for t in (table, cpu_table):
        t.insert(keys, rows)
        t.erase(keys[::3])
        t.purge()
        t.reserve(1 << 18)
        t.insert(keys[::3], rows[::3])
    assert table.n_slots == cpu_table.n_slots == 1 << 19
    v, f = table.get(keys)
    assert f.all()
    np.testing.assert_array_equal(v, rows)


@pytest.mark.parametrize("opt", [SparseSGD(0.05), SparseAdagrad(0.05, initial_accumulator=0.1)], ids=["sgd", "adagrad"])
def test_apply_on_cupy_rows_runs_the_shared_per_row_math(opt):
    """``opt.apply`` on CuPy rows launches the CUDA kernels of the per-row functions the CPU kernels call
    (no vectorised third copy): the CPU's result to a few ulp (FMA contraction on the GPU)."""
    cp = cupy()
    rng = np.random.default_rng(3)
    rows = opt.init_rows(rng.normal(size=(1000, 16)).astype(np.float32))
    g = rng.normal(size=(1000, 16)).astype(np.float32)
    got = opt.apply(cp.asarray(rows), cp.asarray(g))
    assert type(got).__module__.startswith("cupy")
    np.testing.assert_allclose(got.get(), opt.apply(rows, g), rtol=1e-6, atol=1e-7)
