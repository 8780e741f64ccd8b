"""Synthetic generator: determinism, resume, Zipf skew, label rate, Bayes AUC, sharding."""

import numpy as np
import pytest

from hps.data import Batch, SyntheticData, make_keys
from hps.data._synthetic import ZIPF_TABLE_MAX, _Zipf
from hps.errors import InvalidInputError
from hps.metrics import auc


def _assert_same(a, b):
    for f in ("labels", "dense", "keys", "field", "weights", "offsets"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


def test_deterministic_and_resumable():
    kw = dict(rows=5000, fields=5, vocab_per_field=300, seed=3, batch_size=1024)
    a = list(SyntheticData(**kw).batches())
    b = list(SyntheticData(**kw).batches())
    assert [len(x) for x in a] == [1024] * 4 + [904]
    for x, y in zip(a, b):
        _assert_same(x, y)
    for x, y in zip(SyntheticData(**kw).batches(start_batch=3), a[3:]):
        _assert_same(x, y)
    other = next(SyntheticData(**dict(kw, seed=4)).batches())
    assert not np.array_equal(other.keys, a[0].keys)
    ev = list(SyntheticData(**kw).eval_batches())
    assert sum(len(x) for x in ev) == 500
    assert not np.array_equal(ev[0].keys, a[0].keys[: len(ev[0].keys)])


def test_layout_and_keys():
    d = SyntheticData(rows=100, fields=3, vocab_per_field=10, n_dense=2, batch_size=64)
    b = next(d.batches())
    assert (d.n_fields, d.n_dense) == (3, 2) and b.dense.shape == (64, 2)
    np.testing.assert_array_equal(b.offsets, np.arange(65) * 3)
    np.testing.assert_array_equal(b.field, np.tile(np.arange(3), 64))
    all_keys = make_keys(np.repeat(np.arange(3), 10), np.tile(np.arange(10, dtype=np.uint64), 3))
    assert np.isin(b.keys, all_keys).all()
    assert set(np.unique(b.labels)) <= {0.0, 1.0}


def test_zipf_skew_and_label_rate():
    d = SyntheticData(rows=100_000, fields=4, vocab_per_field=10_000, zipf=1.1, batch_size=20_000)
    b = Batch.concat(list(d.batches()))
    _, counts = np.unique(b.keys[b.field == 0], return_counts=True)
    counts = np.sort(counts)[::-1]
    p0 = 1 / np.sum(np.arange(1, 10_001) ** -1.1)  # P(rank 0), ~0.153
    assert abs(counts[0] / 100_000 - p0) < 0.01
    assert 8 < counts[0] / counts[9] < 18  # ~ 10 ** 1.1
    assert 0.22 < b.labels.mean() < 0.28
    assert 0.74 < d.bayes_auc() < 0.82


def test_uniform_and_closed_form_zipf():
    u = np.random.default_rng(0).random(200_000)
    ranks = _Zipf(50, 0.0).ranks(u)
    assert ranks.max() == 49 and abs(np.bincount(ranks.astype(int)).std() / 4000) < 0.05
    for s in (1.0, 1.1, 0.5):
        n = 4 * ZIPF_TABLE_MAX
        z = _Zipf(n, s)
        big = z.ranks(u)
        assert big.max() < n and big.min() == 0
        # exact head: P(rank 0) = 1 / sum_k k ** -s; tail mass beyond the table matches the law
        p = np.arange(1, n + 1, dtype=np.float64) ** -s
        p /= p.sum()
        assert abs(np.mean(big == 0) - p[0]) < 4 * np.sqrt(p[0] / u.size)
        p_tail = p[ZIPF_TABLE_MAX:].sum()
        assert abs(np.mean(big >= ZIPF_TABLE_MAX) - p_tail) < 4 * np.sqrt(p_tail / u.size) + 1e-3
        q = p[2 * ZIPF_TABLE_MAX:].sum()
        assert abs(np.mean(big >= 2 * ZIPF_TABLE_MAX) - q) < 4 * np.sqrt(q / u.size) + 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bayes_auc_beats_a_wrong_model(seed):
    d = SyntheticData(rows=20_000, seed=seed, batch_size=4096)
    ba = d.bayes_auc()
    assert 0.74 < ba < 0.83
    labels = np.concatenate([b.labels for b in d.eval_batches()])
    assert auc(labels, np.random.default_rng(0).random(labels.size)) < ba - 0.15
    p = np.concatenate([d.true_probs(i, eval=True) for i in range(1)])
    assert p.shape == (2000,)


def test_shards_concatenate():
    kw = dict(rows=3000, batch_size=1000)
    full = list(SyntheticData(**kw).batches())
    for n_shards in (3, 4, 7):
        shards = [b for r in range(n_shards) for b in SyntheticData(**kw, shard=(r, n_shards)).batches()]
        _assert_same(Batch.concat(shards), Batch.concat(full))  # contiguous rows, same data


def test_bad_arguments():
    with pytest.raises(InvalidInputError):
        SyntheticData(fields=0)
    with pytest.raises(InvalidInputError):
        SyntheticData(zipf=-1)
    with pytest.raises(InvalidInputError):
        SyntheticData(batch_size=0)


def test_fixed_batches_share_their_constant_columns():
    """``FixedBatch.batch`` hands out views of one kept field/weights pair per field count: every
    batch, larger, smaller or of another field count, gets exactly the columns NumPy would make, and
    a later batch leaves an earlier one's as they were."""
    from hps.data._batch import FixedBatch

    def fixed(n, f):
        keys = np.arange(n * f, dtype=np.uint64).reshape(n, f)
        return FixedBatch(np.zeros(n, np.float32), np.zeros((n, 2), np.float32), keys).batch()

    made = [(n, f, fixed(n, f)) for n, f in [(5, 3), (40, 3), (7, 3), (0, 3), (9, 26), (100, 3), (2, 26)]]
    for n, f, b in made:
        assert b.field.dtype == np.int32 and b.weights.dtype == np.float32
        np.testing.assert_array_equal(b.field, np.tile(np.arange(f, dtype=np.int32), n))
        np.testing.assert_array_equal(b.weights, np.ones(n * f, np.float32))
        np.testing.assert_array_equal(b.keys, np.arange(n * f, dtype=np.uint64))
        np.testing.assert_array_equal(b.offsets, np.arange(n + 1) * f)
