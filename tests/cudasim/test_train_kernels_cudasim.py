"""GPU-resident training kernels (hps/gpu/_train_kernels.py) under Numba's CUDA simulator, against
their CPU twins: the pooling kernels of hps/model/_kernels.py, SparseSGD/SparseAdagrad.apply and the
CTR model's loss and logit gradient.

Run in its own process (``NUMBA_ENABLE_CUDASIM=1 pytest tests/cudasim``). NumPy arrays stand in for
device arrays (the seam of hps._xp); the table lives on the simulated GPU. Launch blocks are patched
to 16 threads, so a few examples already span several blocks.
"""

import numpy as np
import pytest

from hps import HashTable
from hps._xp import array_module, simulated
from hps.errors import InvalidInputError, InvalidTypeError
from hps.gpu import TransferLedger
from hps.gpu import _row_ops as rops
from hps.gpu import _train_ops as ops
from hps.model import SparseAdagrad, SparseAdam, SparseRowwiseAdagrad, SparseSGD
from hps.model import _kernels as cpu
from hps.model._base import _sigmoid
from tests.reference import model as ref

pytestmark = pytest.mark.cudasim


def make_case(seed, n=12, n_fields=3, row_width=7, dtype=np.float32, weighted=True, extra_keys=5):
    """A batch (duplicates inside and across examples, some examples empty), its plan, and a CUDA table
    holding the rows of its unique keys plus a few other keys."""
    rng = np.random.default_rng(seed)
    b = ref.random_batch(rng, n, n_fields, max_keys=3, vocab=5, weighted=weighted)
    keys, inv = np.unique(b.keys, return_inverse=True)
    other = np.arange(1, extra_keys + 1, dtype=np.uint64)
    table = HashTable(4 * (keys.shape[0] + extra_keys) + 4, row_width, device="cuda", dtype=dtype)
    all_keys = np.concatenate([other, keys])
    rows = rng.normal(size=(all_keys.shape[0], row_width)).astype(dtype)
    table.insert(all_keys, rows)
    plan = dict(inv=inv.astype(np.int64), field=b.field.astype(np.int32), weights=b.weights.astype(dtype),
                offsets=b.offsets.astype(np.int64))
    return rng, b, keys, plan, table


def slots_of(table, keys, scalars=None):
    scalars = scalars or ops.BatchScalars()
    slots = np.empty(keys.shape[0], np.int64)
    with table.device_view() as v:
        ops.find_slots_async(v, keys, slots, scalars.missing)
    return slots, scalars


def rows_of(table, keys):
    v, f = table.get(keys)
    assert f.all()
    return v


def test_the_seam_is_numpy_under_the_simulator():
    assert simulated() and array_module("cuda") is np


def test_find_slots_live_absent_and_erased_keys():
    table = HashTable(40, 2, device="cuda")
    keys = np.arange(10, 30, dtype=np.uint64) * np.uint64(104729)
    table.insert(keys, np.ones((20, 2)))
    table.erase(keys[:3])
    ask = np.concatenate([keys[::-1], np.array([7, 8], np.uint64)])  # 20 keys: 3 erased, 2 never there
    slots, scalars = slots_of(table, ask)
    with table.device_view() as v:
        tk = v.keys.copy_to_host()
    found = slots >= 0
    assert found.tolist() == [True] * 17 + [False] * 5
    np.testing.assert_array_equal(tk[slots[found]], ask[found])
    assert len(set(slots[found].tolist())) == 17
    assert scalars.read(TransferLedger(np)) == {"loss": 0.0, "missing": 5}
    empty, _ = slots_of(table, np.empty(0, np.uint64))
    assert empty.shape == (0,)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pool_forward_matches_pool_fields(seed, dtype):
    rng, b, keys, plan, table = make_case(seed, dtype=dtype)
    slots, scalars = slots_of(table, keys)
    rows = rows_of(table, keys)
    for col0, width in ((0, 3), (3, 1), (0, 7)):  # an embedding, a first-order column, the whole row
        want = np.zeros((len(b), b.n_fields * width), dtype)
        cpu.pool_fields(np.ascontiguousarray(rows[:, col0:col0 + width]), plan["inv"], plan["field"],
                        plan["weights"], plan["offsets"], want)
        got = np.full_like(want, np.nan)  # every element must be written
        with table.device_view() as v:
            ops.pool_forward_async(v, slots, out=got, width=width, col0=col0, **plan)
        np.testing.assert_array_equal(got, want)
    assert scalars.read(TransferLedger(np))["missing"] == 0


def test_pool_forward_skips_a_missing_key_and_counts_it():
    rng, b, keys, plan, table = make_case(2)
    rows = rows_of(table, keys)
    table.erase(keys[:1])
    slots, scalars = slots_of(table, keys)
    assert slots[0] == -1
    rows[0] = 0  # the missing key adds nothing
    want = np.zeros((len(b), b.n_fields * 3), np.float32)
    cpu.pool_fields(np.ascontiguousarray(rows[:, :3]), plan["inv"], plan["field"], plan["weights"],
                    plan["offsets"], want)
    got = np.empty_like(want)
    with table.device_view() as v:
        ops.pool_forward_async(v, slots, out=got, width=3, **plan)
    np.testing.assert_array_equal(got, want)
    assert scalars.read(TransferLedger(np))["missing"] == 1


def test_gather_rows_and_pool_from_gathered_rows():
    """An owner gathers the parameter part of asked rows (in ask order, repeats allowed, -1 slot ->
    zeros); an asking rank pools the rows it received like the table itself would."""
    rng, b, keys, plan, table = make_case(9)
    slots, _ = slots_of(table, keys)
    rows = rows_of(table, keys)
    idx = rng.integers(0, keys.shape[0], 30).astype(np.int64)
    got = np.full((30, 3), np.nan, np.float32)
    with table.device_view() as v:
        ops.gather_rows_async(v, slots, idx, got)
    np.testing.assert_array_equal(got, rows[idx, :3])
    missing = slots.copy()
    missing[idx[0]] = -1
    with table.device_view() as v:
        ops.gather_rows_async(v, missing, idx[:1], got[:1])
    assert (got[0] == 0).all()
    params = np.ascontiguousarray(rows[:, :3])
    want = np.zeros((len(b), b.n_fields * 3), np.float32)
    cpu.pool_fields(params, plan["inv"], plan["field"], plan["weights"], plan["offsets"], want)
    out = np.full_like(want, np.nan)
    ops.pool_forward_rows_async(params, np.arange(keys.shape[0], dtype=np.int64), out=out, **plan)
    np.testing.assert_array_equal(out, want)
    with pytest.raises(InvalidInputError, match="ident must have"):
        ops.pool_forward_rows_async(params, np.arange(2, dtype=np.int64), out=out, **plan)


@pytest.mark.parametrize("seed", [3, 4])
def test_pool_backward_matches_pool_fields_backward(seed):
    rng, b, keys, plan, _ = make_case(seed)
    p = 4
    g = rng.normal(size=(len(b), b.n_fields * p)).astype(np.float32)
    want = np.zeros((keys.shape[0], p), np.float32)
    cpu.pool_fields_backward(g, plan["inv"], plan["field"], plan["weights"], plan["offsets"], want)
    got = np.full((keys.shape[0], p), np.nan, np.float32)  # zeroed by the call
    ops.pool_backward_async(g, grads=got, **plan)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_pool_backward_duplicates_sum_exactly():
    """Closed form: one key in every example, several times, with integer weights and gradients."""
    from hps.data import Batch

    n, reps, p = 20, 3, 2
    offsets = np.arange(0, n * reps + 1, reps, dtype=np.int64)
    b = Batch(np.zeros(n, np.float32), np.zeros((n, 0), np.float32), np.full(n * reps, 9, np.uint64),
              np.zeros(n * reps, np.int32), np.full(n * reps, 2.0, np.float32), offsets, 1)
    g = np.tile(np.arange(1, p + 1, dtype=np.float32), (n, 1))
    grads = np.empty((1, p), np.float32)
    ops.pool_backward_async(g, np.zeros(n * reps, np.int64), b.field, b.weights, b.offsets, grads)
    np.testing.assert_array_equal(grads, [[2.0 * n * reps * (j + 1) for j in range(p)]])


def zipf_case(seed, n=40, n_fields=3, p=4):
    """Many occurrences of a few keys (sums of tens of products), empty examples, float32 gradients."""
    rng = np.random.default_rng(seed)
    b = ref.random_batch(rng, n, n_fields, max_keys=4, vocab=3, weighted=True)
    keys, inv = np.unique(b.keys, return_inverse=True)
    plan = dict(inv=inv.astype(np.int64), field=b.field.astype(np.int32), weights=b.weights.astype(np.float32),
                offsets=b.offsets.astype(np.int64))
    g = rng.normal(size=(n, n_fields * p)).astype(np.float32)
    return keys.shape[0], plan, g


def sorted_backward(u, plan, g, chunk=ops.BACKWARD_CHUNK):
    bp = ops.backward_plan(plan["inv"], plan["field"], plan["weights"], plan["offsets"], u, g.shape[1] // 3, np,
                           chunk=chunk)
    got = np.full((u, g.shape[1] // 3), np.nan, np.float32)  # every element written
    ops.pool_backward_sorted_async(g, bp, got)
    return got


@pytest.mark.parametrize("seed", [3, 4])
def test_sorted_backward_is_pool_fields_backward_bit_for_bit(seed):
    """Each key's occurrences sum from 0 in CSR order, as the CPU kernel adds them: the same float32
    bits (no key here has more than BACKWARD_CHUNK occurrences)."""
    u, plan, g = zipf_case(seed)
    want = np.zeros((u, 4), np.float32)
    cpu.pool_fields_backward(g, plan["inv"], plan["field"], plan["weights"], plan["offsets"], want)
    assert np.bincount(plan["inv"]).max() > 10  # sums long enough for the order to show
    np.testing.assert_array_equal(sorted_backward(u, plan, g), want)


def test_sorted_backward_in_chunks_is_the_chunk_sums_in_order():
    """Keys with more occurrences than a chunk: chunks of 3 in CSR order, summed from 0, then the chunks
    in order (a Python model of that fixed order), bit for bit; and within rounding of the CPU."""
    u, plan, g = zipf_case(5)
    order = np.argsort(plan["inv"], kind="stable")
    ex = np.searchsorted(plan["offsets"][1:], order, side="right")
    want = np.zeros((u, 4), np.float32)
    for i in range(u):
        occ = order[plan["inv"][order] == i]
        total = np.zeros(4, np.float32)
        for a in range(0, occ.shape[0], 3):
            part = np.zeros(4, np.float32)
            for k in occ[a:a + 3]:
                e = ex[np.flatnonzero(order == k)[0]]
                f = plan["field"][k]
                part += plan["weights"][k] * g[e, f * 4:(f + 1) * 4]
            total += part
        want[i] = total
    got = sorted_backward(u, plan, g, chunk=3)
    np.testing.assert_array_equal(got, want)
    cpu_sums = np.zeros((u, 4), np.float32)
    cpu.pool_fields_backward(g, plan["inv"], plan["field"], plan["weights"], plan["offsets"], cpu_sums)
    np.testing.assert_allclose(got, cpu_sums, rtol=1e-5, atol=1e-5)


def test_sorted_backward_does_not_depend_on_the_launch_geometry(monkeypatch):
    """The interleaving a GPU chooses, forced in the simulator: blocks of other sizes and grid-stride
    rounds change the order in which the atomic kernel's additions land (float sums move in the last
    bits), never the sorted kernel's result. Keys that never occur get zeros."""
    from hps import _launch

    u, plan, g = zipf_case(6)
    plan["inv"] = plan["inv"] + 1  # key 0 occurs nowhere
    u += 1
    results, atomic = [], []
    for block, blocks in [(16, 3), (32, 1), (8, 7)]:
        monkeypatch.setattr(_launch, "BLOCK_SIZE", block)
        monkeypatch.setattr(_launch, "SIM_MAX_BLOCKS", blocks)
        results.append(sorted_backward(u, plan, g))
        a = np.empty((u, 4), np.float32)
        ops.pool_backward_async(g, grads=a, **plan)
        atomic.append(a)
    assert all(np.array_equal(results[0], r) for r in results[1:])
    assert (results[0][0] == 0).all()
    for a in atomic:  # the atomic sums agree only to rounding
        np.testing.assert_allclose(a, results[0], rtol=1e-5, atol=1e-5)


def test_backward_plan_of_an_empty_minibatch_zeroes_the_gradients():
    plan = dict(inv=np.zeros(0, np.int64), field=np.zeros(0, np.int32), weights=np.zeros(0, np.float32),
                offsets=np.zeros(4, np.int64))
    got = np.full((2, 4), np.nan, np.float32)
    bp = ops.backward_plan(plan["inv"], plan["field"], plan["weights"], plan["offsets"], 2, 4, np)
    ops.pool_backward_sorted_async(np.zeros((3, 12), np.float32), bp, got)
    assert (got == 0).all()
    with pytest.raises(InvalidInputError):
        ops.pool_backward_sorted_async(np.zeros((3, 12), np.float32), bp, np.zeros((3, 4), np.float32))


@pytest.mark.parametrize("opt", [SparseSGD(0.1), SparseAdagrad(0.05, initial_accumulator=0.1),
                                 SparseAdagrad(0.3), SparseSGD(0.1, l2=0.01), SparseAdagrad(0.3, l2=0.02),
                                 SparseRowwiseAdagrad(0.2, initial_accumulator=0.1),
                                 SparseRowwiseAdagrad(0.2, l2=0.05), SparseAdam(0.01),
                                 SparseAdam(0.02, betas=(0.8, 0.99), eps=1e-6, l2=0.01)],
                         ids=["sgd", "adagrad-init0.1", "adagrad", "sgd-l2", "adagrad-l2", "rowwise-adagrad",
                              "rowwise-adagrad-l2", "adam", "adam-l2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_update_matches_the_cpu_optimizer(opt, dtype):
    """Rows [embedding (3) | state | one extra column] born with opt.init_rows; the kernel's in-place
    step equals opt.apply on the host (bit for bit, but for Adam's float64 powers, whose last bit may
    differ between the simulator's Python and Numba's CPU code); other keys and the extra column are
    untouched."""
    rng = np.random.default_rng(5)
    d, u = 3, 21
    keys = rng.permutation(np.arange(100, 100 + 2 * u, dtype=np.uint64))[:u]
    emb = rng.normal(size=(u, d)).astype(dtype)
    rows = np.concatenate([opt.init_rows(emb), rng.normal(size=(u, 1)).astype(dtype)], axis=1)
    table = HashTable(64, rows.shape[1], device="cuda", dtype=dtype)
    table.insert(keys, rows)
    bystander = np.array([5], np.uint64)
    table.insert(bystander, np.ones((1, rows.shape[1])))
    grads = rng.normal(size=(u, d)).astype(dtype)
    want = rows
    for _ in range(2):  # two steps: the accumulator carries over
        slots, _ = slots_of(table, keys)
        with table.device_view() as v:
            rops.sparse_update_async(v, slots, grads, opt)
        want = opt.apply(want, grads)
    if opt.name == "adam":
        np.testing.assert_allclose(rows_of(table, keys), want, rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(rows_of(table, keys), want)
    np.testing.assert_array_equal(rows_of(table, bystander), np.ones((1, rows.shape[1])))


@pytest.mark.parametrize("l2", [0.0, 0.05])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("opt", [SparseSGD(0.1), SparseAdagrad(0.05, initial_accumulator=0.1),
                                 SparseRowwiseAdagrad(0.2), SparseAdam(0.01)],
                         ids=["sgd", "adagrad", "rowwise-adagrad", "adam"])
def test_device_rows_step_with_the_cpu_kernels_math(opt, dtype, l2):
    """``apply`` on device rows (CuPy's path: ``_optim_cuda.update_rows_async`` over every row, the CUDA
    kernels of the per-row functions the CPU kernels call) takes the CPU's steps; columns after the
    state are carried unchanged. Bit for bit but for Adam's float64 powers (the simulator's Python vs
    Numba's CPU code may differ in the last bit)."""
    from hps.model import _optim_cuda

    opt = type(opt)(**{**{"lr": opt.lr}, **opt._hyper(), "l2": l2})
    rng = np.random.default_rng(6)
    P = 4
    rows = np.concatenate([opt.init_rows(rng.normal(size=(9, P))), rng.normal(size=(9, 2))], axis=1).astype(dtype)
    cpu_rows, dev_rows = rows.copy(), rows.copy()
    for _ in range(3):
        g = rng.normal(size=(9, P)).astype(dtype)
        cpu_rows = opt.apply(cpu_rows, g)
        _optim_cuda.update_rows_async(dev_rows, np.arange(9, dtype=np.int64), g, opt)
    if opt.name == "adam":
        np.testing.assert_allclose(dev_rows, cpu_rows, rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(dev_rows, cpu_rows)
    np.testing.assert_array_equal(dev_rows[:, -2:], rows[:, -2:])


def test_updates_skip_missing_slots_and_refuse_bad_layouts():
    table = HashTable(8, 4, device="cuda")
    table.insert(np.array([1, 2], np.uint64), np.ones((2, 4)))
    slots = np.array([-1, -1], np.int64)
    g = np.ones((2, 2), np.float32)
    with table.device_view() as v:
        rops.sgd_update_async(v, slots, g, 0.5)
        rops.adagrad_update_async(v, slots, g, 0.5)
        rops.rowwise_adagrad_update_async(v, slots, g, 0.5)
        rops.adam_update_async(v, slots, np.ones((2, 1), np.float32), 0.5)
        with pytest.raises(InvalidInputError, match="accumulator columns"):
            rops.adagrad_update_async(v, slots, g, 0.5, state_col=1)
        with pytest.raises(InvalidInputError, match="accumulator columns"):
            rops.adagrad_update_async(v, slots, np.ones((2, 3), np.float32), 0.5)
        with pytest.raises(InvalidInputError, match="need rows of at least 2 \\+ 5"):
            rops.adam_update_async(v, slots, g, 0.5)
        with pytest.raises(InvalidInputError, match="betas"):
            rops.adam_update_async(v, slots, np.ones((2, 1), np.float32), 0.5, betas=(1.0, 0.9))
        with pytest.raises(InvalidInputError, match="no GPU kernel"):
            rops.sparse_update_async(v, slots, g, object())
        with pytest.raises(InvalidInputError, match="learning rate"):
            rops.sgd_update_async(v, slots, g, float("nan"))
        with pytest.raises(InvalidInputError, match="l2"):
            rops.sgd_update_async(v, slots, g, 0.5, l2=-1.0)
        with pytest.raises(InvalidTypeError, match="float32"):
            rops.sgd_update_async(v, slots, g.astype(np.float64), 0.5)
    assert (table.get(np.array([1, 2], np.uint64))[0] == 1).all()


def test_bce_loss_grad_matches_the_model():
    rng = np.random.default_rng(6)
    n = 40  # 3 blocks of 16
    z = np.concatenate([rng.normal(scale=3, size=n - 4), [-40, 40, 0, 1e-3]]).astype(np.float32)
    y = rng.integers(0, 2, n).astype(np.float32)
    scalars = ops.BatchScalars()
    dz = np.empty(n, np.float32)
    ops.bce_loss_grad_async(z, y, 64, dz, scalars.loss)
    ops.bce_loss_grad_async(z[:5], y[:5], 64, dz[:5].copy(), scalars.loss)  # accumulates
    # exp differs from NumPy's in the last bit (the simulator's math.exp is double; a GPU's expf
    # is within 2 ulp), so equal to a few ulp, not bit for bit
    np.testing.assert_allclose(dz, (_sigmoid(np, z) - y) / np.float32(64), rtol=1e-6, atol=1e-9)
    z64 = z.astype(np.float64)
    per = np.maximum(z64, 0) - y * z64 + np.log1p(np.exp(-np.abs(z64)))
    led = TransferLedger(np)
    got = scalars.read(led)
    assert got["loss"] == pytest.approx(per.sum() + per[:5].sum(), rel=1e-12)
    assert led.metrics()["d2h_bytes"]["minibatch"] == 16
    scalars.zero()
    assert scalars.read(led) == {"loss": 0.0, "missing": 0}
    with pytest.raises(InvalidInputError, match="n_total"):
        ops.bce_loss_grad_async(z, y, n - 1, dz, scalars.loss)


@pytest.mark.parametrize("seed", [7, 8])
def test_a_minibatch_step_matches_the_cpu_path(seed):
    """find_slots -> pool_forward -> pool_backward -> Adagrad on the device, against the CPU trainer's
    get -> pool_fields -> pool_fields_backward -> SparseAdagrad.apply -> insert."""
    d = 3
    opt = SparseAdagrad(0.1, initial_accumulator=0.01)
    rng, b, keys, plan, table = make_case(seed, row_width=2 * d)
    cpu_table = HashTable(table.capacity, 2 * d)
    k0, r0 = table.export()
    r0[:, d:] = np.abs(r0[:, d:])  # an accumulator is never negative
    table.insert(k0, r0)
    cpu_table.insert(k0, r0)
    g_pooled = rng.normal(size=(len(b), b.n_fields * d)).astype(np.float32)
    # CPU
    rows = rows_of(cpu_table, keys)
    pooled_cpu = np.zeros((len(b), b.n_fields * d), np.float32)
    cpu.pool_fields(np.ascontiguousarray(rows[:, :d]), plan["inv"], plan["field"], plan["weights"],
                    plan["offsets"], pooled_cpu)
    g_cpu = np.zeros((keys.shape[0], d), np.float32)
    cpu.pool_fields_backward(g_pooled, plan["inv"], plan["field"], plan["weights"], plan["offsets"], g_cpu)
    cpu_table.insert(keys, opt.apply(rows, g_cpu))
    # device
    scalars = ops.BatchScalars()
    slots = np.empty(keys.shape[0], np.int64)
    pooled = np.empty_like(pooled_cpu)
    grads = np.empty((keys.shape[0], d), np.float32)
    with table.device_view() as v:
        ops.find_slots_async(v, keys, slots, scalars.missing)
        ops.pool_forward_async(v, slots, out=pooled, width=d, **plan)
        ops.pool_backward_async(g_pooled, grads=grads, **plan)
        rops.sparse_update_async(v, slots, grads, opt)
    np.testing.assert_array_equal(pooled, pooled_cpu)
    np.testing.assert_allclose(grads, g_cpu, rtol=1e-6, atol=1e-7)
    kc, vc = cpu_table.export()
    kg, vg = table.export()
    np.testing.assert_array_equal(np.sort(kc), np.sort(kg))
    np.testing.assert_allclose(vg[np.argsort(kg)], vc[np.argsort(kc)], rtol=1e-5, atol=1e-6)
    assert scalars.read(TransferLedger(np))["missing"] == 0


def test_empty_minibatch_is_a_noop():
    from hps.data import Batch

    table = HashTable(8, 4, device="cuda")
    table.insert(np.array([3], np.uint64), np.ones((1, 4)))
    e64, e32 = np.empty(0, np.int64), np.empty(0, np.int32)
    b = Batch(np.empty(0, np.float32), np.empty((0, 0), np.float32), np.empty(0, np.uint64), e32,
              np.empty(0, np.float32), np.zeros(1, np.int64), 2)
    scalars = ops.BatchScalars()
    slots = np.empty(0, np.int64)
    with table.device_view() as v:
        ops.find_slots_async(v, np.empty(0, np.uint64), slots, scalars.missing)
        ops.pool_forward_async(v, slots, e64, e32, b.weights, b.offsets, np.empty((0, 4), np.float32), width=2)
        ops.pool_backward_async(np.empty((0, 4), np.float32), e64, e32, b.weights, b.offsets,
                                np.empty((0, 2), np.float32))
        rops.sparse_update_async(v, slots, np.empty((0, 2), np.float32), SparseAdagrad(0.1))
    ops.bce_loss_grad_async(np.empty(0, np.float32), np.empty(0, np.float32), 1, np.empty(0, np.float32),
                            scalars.loss)
    assert scalars.read(TransferLedger(np)) == {"loss": 0.0, "missing": 0}
    assert (table.get(np.array([3], np.uint64))[0] == 1).all()


def test_batch_scalars_add_another_gpus_counters():
    main, part = ops.BatchScalars(), np.array([0.0, 3.0])  # a part's [loss, missing], as _device_rows keeps
    ops.bce_loss_grad_async(np.zeros(2, np.float32), np.ones(2, np.float32), 2, np.empty(2, np.float32),
                            main.loss)
    main.add(part)
    main.add(part)
    got = main.read(TransferLedger(np))
    assert got["missing"] == 6 and got["loss"] == pytest.approx(2 * np.log(2))
    with pytest.raises(InvalidInputError, match="one cell per accumulator"):
        main.add(np.zeros(3))


def test_the_ledger_reads_simulated_device_arrays():
    from numba import cuda

    led = TransferLedger(np)
    dev = cuda.to_device(np.arange(6, dtype=np.float32))
    assert led.to_host(dev, "writeback").tolist() == list(range(6))
    assert led.metrics()["d2h_bytes"]["writeback"] == 24


@pytest.mark.parametrize("n_parts", [1, 2, 3, 5])
def test_partition_on_the_device_matches_the_host_policy(n_parts):
    """Algorithm 2's partitioning of a device batch: every key's part, the stable order and the part
    offsets equal group_by_owner(owner_of(keys, n, PART_SALT)) (duplicates kept, in input order);
    only the counts cross, through the ledger."""
    from hps._hashing import PART_SALT, group_by_owner, owner_of
    from hps.gpu._partition_ops import part_of_async, partition_keys

    rng = np.random.default_rng(n_parts)
    keys = np.concatenate([rng.integers(0, 2**63, 37, dtype=np.uint64), np.array([5, 5, 2**64 - 2], np.uint64)])
    parts = np.empty(keys.shape[0], np.int32)
    counts = np.full(n_parts, 99, np.int64)  # zeroed by the call
    part_of_async(keys, n_parts, parts, counts)
    np.testing.assert_array_equal(parts, owner_of(keys, n_parts, PART_SALT))
    np.testing.assert_array_equal(counts, np.bincount(parts, minlength=n_parts))
    led = TransferLedger(np)
    order, offsets = partition_keys(keys, n_parts, np, led)
    want_order, want_offsets = group_by_owner(owner_of(keys, n_parts, PART_SALT), n_parts)
    np.testing.assert_array_equal(order, want_order)
    np.testing.assert_array_equal(offsets, want_offsets)
    assert led.metrics()["d2h_bytes"]["plan"] == 8 * n_parts
    order, offsets = partition_keys(np.empty(0, np.uint64), n_parts, np)
    assert order.shape == (0,) and offsets.tolist() == [0] * (n_parts + 1)
    with pytest.raises(InvalidInputError, match="n_parts"):
        part_of_async(keys, 2, parts, np.zeros(3, np.int64))
