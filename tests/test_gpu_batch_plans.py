"""``hps.gpu.minibatch_plans`` (every mini-batch's plan of a batch in one pass) equals the per-mini-batch
functions it replaces in the place stage, ``unique_inverse`` and ``backward_plan``: on the host with
NumPy as the array module (the same code runs on CuPy; the simulator and GPU jobs check it end to end)."""

import numpy as np
import pytest

from hps.errors import InvalidInputError
from hps.gpu import backward_plan, minibatch_plans, unique_inverse


def batch(rng, n_examples, fields, vocab):
    """A batch in CSR form with a few empty examples and keys repeated within and across examples."""
    per = rng.integers(0, fields + 1, n_examples)
    offsets = np.zeros(n_examples + 1, np.int64)
    offsets[1:] = np.cumsum(per)
    nnz = int(offsets[-1])
    keys = rng.integers(0, vocab, nnz).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return keys, rng.integers(0, fields, nnz).astype(np.int32), rng.random(nnz).astype(np.float32), offsets


@pytest.mark.parametrize("seed", range(40))
def test_one_pass_over_the_batch_equals_every_minibatch_planned_alone(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    keys, field, weights, offsets = batch(rng, n, 5, int(rng.integers(1, 60)))
    cuts = np.unique(rng.integers(0, n + 1, int(rng.integers(0, 6))))
    bounds = np.unique(np.concatenate([[0, n], cuts, cuts[:1]]))  # an empty mini-batch now and then
    if seed % 2:
        bounds = np.sort(np.concatenate([bounds, bounds[1:2]]))
    reads, ups = [], []
    plans = minibatch_plans(keys, field, weights, offsets, bounds, offsets, 4, np,
                            read=lambda a: reads.append(a.nbytes) or a.copy(),
                            upload=lambda h: ups.append(h.nbytes) or h.copy(), chunk=3)
    assert len(plans) == len(bounds) - 1 and reads == [16 * len(bounds)]
    assert ups == ([8 * len(bounds)] if offsets[bounds[-1]] else [])
    for j, (uk, inv, off, bp) in enumerate(plans):
        a, b = int(bounds[j]), int(bounds[j + 1])
        ka, kb = int(offsets[a]), int(offsets[b])
        wk, winv = unique_inverse(keys[ka:kb], np)
        np.testing.assert_array_equal(uk, wk)
        np.testing.assert_array_equal(inv, winv)
        np.testing.assert_array_equal(off, offsets[a:b + 1] - ka)
        want = backward_plan(winv, field[ka:kb], weights[ka:kb], offsets[a:b + 1] - ka, wk.shape[0], 4, np, chunk=3)
        c = int(want.cptr[-1])  # the chunks in use; the per-mini-batch plan allocates a tail of empty ones
        np.testing.assert_array_equal(bp.cptr, want.cptr)
        for name in ("ex", "fld", "wts"):
            np.testing.assert_array_equal(getattr(bp, name), getattr(want, name), err_msg=name)
        np.testing.assert_array_equal(bp.cstart, want.cstart[:c])
        np.testing.assert_array_equal(bp.cend, want.cend[:c])
        assert bp.partial.shape == (c, 4) and bp.ex.dtype == np.int64 and bp.fld.dtype == np.int32


def test_a_batch_without_keys_and_bad_bounds():
    offsets = np.zeros(4, np.int64)
    e = np.zeros(0, np.uint64)
    plans = minibatch_plans(e, e.astype(np.int32), e.astype(np.float32), offsets, [0, 2, 3], offsets, 2, np,
                            read=lambda a: pytest.fail("nothing to read"), upload=lambda h: pytest.fail("nor to send"))
    assert [(uk.shape[0], inv.shape[0], off.tolist(), bp.cptr.tolist()) for uk, inv, off, bp in plans] == [
        (0, 0, [0, 0, 0], [0]), (0, 0, [0, 0], [0])]
    for bad in ([1, 3], [0, 2, 1], [0]):
        with pytest.raises(InvalidInputError):
            minibatch_plans(e, e.astype(np.int32), e.astype(np.float32), offsets, bad, offsets, 2, np, read=None,
                            upload=None)
