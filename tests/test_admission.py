"""Feature admission and expiry (docs/admission.md): the delete interfaces of every tier, the
count-min sketch, and training runs whose final table is exactly what the documented rules give."""

import shutil

import numpy as np
import pytest

from hps.data import SyntheticData
from hps.mem import MemPS, RowCache, RowInitializer
from hps.ssd import SSDOptions, SSDStore
from hps.train import main
from hps.train import _admission_kernels as AK
from hps.train._admission import SHARED_LOW, SKETCH_SALTS, FeatureFilter, shared_keys
from hps.train._collectives import Collectives
from tests.test_train import SMALL, assert_same_model, run_cli

# SMALL: 12,000 synthetic rows, 4 fields of 3,000 values, batches of 2,048 -> batches 0..5
BATCHES = 6


def small_batches(drift=0.0):
    """The training batches of SMALL (one shard), as the trainer reads them."""
    data = SyntheticData(rows=12000, fields=4, vocab_per_field=3000, zipf=1.1, n_dense=4, seed=0,
                         batch_size=2048, block_rows=2048, drift=drift)
    return [b.keys.copy() for b in data.batches()]


# -- the tiers' delete interfaces --------------------------------------------------------------------------

def test_row_cache_discard_drops_rows_and_frees_their_slots():
    c = RowCache(8, 2, ghost_factor=1)
    keys = np.arange(1, 7, dtype=np.uint64)
    c.put(keys, np.ones((6, 2), np.float32), dirty=True)
    assert c.discard(np.array([2, 4, 99], np.uint64)) == 2
    assert len(c) == 4 and c.contains(keys).tolist() == [True, False, True, False, True, True]
    assert c.stats().dirty == 4
    ev = c.put(np.arange(10, 14, dtype=np.uint64), np.zeros((4, 2), np.float32))
    assert ev.keys.shape[0] == 0  # the two freed slots (and two free ones) took the new keys
    c.lookup(np.array([1], np.uint64), pin=True)
    with pytest.raises(Exception, match="pinned"):
        c.discard(np.array([1, 3], np.uint64))
    assert c.contains(np.array([1, 3], np.uint64)).all()  # nothing removed


def test_ssd_store_delete_forgets_keys_and_compaction_reclaims_them(tmp_path):
    with SSDStore(tmp_path / "s", dim=4, rows_per_file=100, options=SSDOptions(background=False)) as st:
        keys = np.arange(1, 201, dtype=np.uint64)
        st.dump(keys, np.ones((200, 4), np.float32))
        assert st.delete(np.concatenate([keys[:160], [999]]).astype(np.uint64)) == 160
        rows, found = st.load(keys)
        assert found.tolist() == [False] * 160 + [True] * 40 and len(st) == 40
        assert st.stats()["stale_rows"] == 160
        st.compact()  # both files are more than half stale
        s = st.stats()
        assert s["live_rows"] == 40 and s["stale_rows"] == 0 and s["files"] == 1
        assert st.load(keys[160:])[1].all()


def test_memps_delete_reaches_cache_and_store_and_a_deleted_key_is_born_again(tmp_path):
    with SSDStore(tmp_path / "s", dim=4) as st:
        init = RowInitializer(2, 4, seed=0)
        ps = MemPS(st, 4, capacity_rows=4, initializer=init)
        keys = np.arange(1, 9, dtype=np.uint64)
        ps.pull(keys[:4])
        ps.push(keys[:4], np.full((4, 4), 7, np.float32))
        ps.pull(keys[4:])  # evicts the first four (dirty) into the store
        ps.push(keys[4:], np.full((4, 4), 8, np.float32))
        ps.flush()
        assert ps.delete(keys[[0, 5]]) == 2
        assert not st.load(keys[[0, 5]])[1].any() and not ps.cache.contains(keys[[5]]).any()
        np.testing.assert_array_equal(ps.read(keys[[0, 5]]), init(keys[[0, 5]]))
        np.testing.assert_array_equal(ps.read(keys[[1, 6]]), [[7] * 4, [8] * 4])


# -- the sketch and the owner's decisions -----------------------------------------------------------------

def test_count_min_sketch_never_undercounts_and_overcounts_within_its_bound():
    rng = np.random.default_rng(0)
    w = 1 << 12
    sketch = np.zeros((4, w), np.uint32)
    true = {}
    for _ in range(8):  # 8 batches of distinct Zipf keys with counts, N ~ w
        keys = np.unique(rng.zipf(1.2, 600).astype(np.uint64))
        counts = rng.integers(1, 3, keys.shape[0]).astype(np.int64)
        est = np.empty(keys.shape[0], np.int64)
        AK.sketch_add(sketch, SKETCH_SALTS, keys, counts, est)
        for k, c in zip(keys.tolist(), counts.tolist()):
            true[k] = true.get(k, 0) + c
        exact = np.array([true[k] for k in keys.tolist()])
        assert (est >= exact).all()
    n = sum(true.values())
    keys = np.array(sorted(true), np.uint64)
    est = np.empty(keys.shape[0], np.int64)
    AK.sketch_add(sketch, SKETCH_SALTS, keys, np.zeros(keys.shape[0], np.int64), est)
    over = est - np.array([true[k] for k in keys.tolist()])
    assert (over >= 0).all() and np.mean(over > np.e * n / w) <= np.exp(-4)


def test_filter_admits_a_key_at_its_kth_occurrence_and_maps_the_rest_to_their_fields_shared_key():
    f = FeatureFilter(Collectives(), admit_after=3, expire_after=0, sketch_width=1024)
    a, b = np.uint64(5 << 48 | 11), np.uint64(2 << 48 | 12)
    out = f.admit(np.array([a, b, a], np.uint64))       # a twice, b once
    assert out.tolist() == [a | SHARED_LOW, b | SHARED_LOW, a | SHARED_LOW]
    assert out.tolist() == shared_keys(np.array([a, b, a])).tolist()
    f.touch(0, np.unique(out))
    out = f.admit(np.array([b, a], np.uint64))          # a's 3rd occurrence: admitted, for this batch
    assert out.tolist() == [b | SHARED_LOW, a]
    f.touch(1, np.unique(out))
    assert f.admitted == 1 and f.admitted_mask(np.array([a, b, b | SHARED_LOW])).tolist() == [True, False, True]
    st = f.state()
    g = FeatureFilter(Collectives(), 3, 0, 1024)
    g.load_state(st)
    assert g.admit(np.array([b], np.uint64)).tolist() == [b]  # b's 3rd: the restored sketch counted two
    assert np.uint64(5 << 48 | 0xFFFFFFFFFFFF) == np.uint64(5 << 48) | SHARED_LOW  # the documented key


def test_filter_expires_keys_unused_for_b_batches():
    f = FeatureFilter(Collectives(), admit_after=0, expire_after=4, sketch_width=1024)
    gone = []
    for i in range(8):
        f.touch(i, np.array([100 + i, 1], np.uint64))  # key 1 every batch, key 100+i once
        f.expire(i, gone.append)
    assert np.concatenate(gone).tolist() == [100, 101, 102, 103]  # at batches 4..7
    assert f.expired == 4 and f.rank_metrics()["known"] == 5


# -- training runs ------------------------------------------------------------------------------------------

def test_expiry_keeps_exactly_the_keys_of_the_last_b_batches(tmp_path, capsys):
    """--expire-after 4 sweeps every batch: after batch 5 the table holds the keys of batches 2..5."""
    model, m = run_cli(tmp_path, "exp", "--expire-after", "4", "--drift", "0.2")
    batches = small_batches(drift=0.2)
    want = np.unique(np.concatenate(batches[BATCHES - 4:]))
    np.testing.assert_array_equal(np.sort(model[0]), want)
    last, expired = {}, 0  # the rule, played per batch: touch, then delete what is 4 batches old
    for i, b in enumerate(batches):
        last.update(dict.fromkeys(np.unique(b).tolist(), i))
        old = [k for k, j in last.items() if j <= i - 4]
        expired += len(old)
        for k in old:
            del last[k]
    assert m["expired_keys"] == expired > 0
    assert m["known_keys"] == m["table_rows"] == want.shape[0]
    out = capsys.readouterr().out
    assert f"admission/expiry: 0 keys admitted, {expired:,} expired, {want.shape[0]:,} with a row" in out


def test_admission_gives_rows_to_the_keys_seen_k_times_and_shared_rows_to_the_others(tmp_path):
    model, m = run_cli(tmp_path, "adm", "--admit-after", "3")
    keys, counts = np.unique(np.concatenate(small_batches()), return_counts=True)
    shared = np.unique(shared_keys(keys[counts < 3]))
    np.testing.assert_array_equal(np.sort(model[0]), np.sort(np.concatenate([keys[counts >= 3], shared])))
    assert m["admitted_keys"] == int((counts >= 3).sum())
    assert "expired_keys" in m and m["expired_keys"] == 0


def test_admit_after_one_is_a_run_without_admission(tmp_path):
    plain, mp = run_cli(tmp_path, "plain")
    one, m1 = run_cli(tmp_path, "one", "--admit-after", "1")
    assert_same_model(plain, one, 0.0)
    assert m1["auc"] == mp["auc"]


def test_resume_restores_admission_and_expiry_state(tmp_path):
    """A checkpoint taken while prepare ran ahead holds the state as of its batch: resuming from it
    ends with the uninterrupted run's model and counts."""
    flags = ["--epochs", "2", "--admit-after", "2", "--expire-after", "3", "--drift", "0.1",
             "--admit-sketch-width", "65536"]
    ck = tmp_path / "ck"
    full, mf = run_cli(tmp_path, "full", *flags, "--checkpoint-dir", str(ck), "--checkpoint-every", "4",
                       "--keep-checkpoints", "3")
    # keep ckpt-3 only (ckpt-7 and ckpt-11 came after): resume from the middle of epoch 0
    for d in ("ckpt-00000007", "ckpt-00000011"):
        shutil.rmtree(ck / d)
    (ck / "LATEST").write_text("ckpt-00000003\n")
    resumed, mr = run_cli(tmp_path, "resumed", *flags, "--checkpoint-dir", str(ck), "--resume")
    assert_same_model(full, resumed, 0.0)
    for k in ("admitted_keys", "expired_keys", "known_keys", "table_rows", "auc"):
        assert mr[k] == mf[k], k


def test_a_resume_without_the_admission_the_checkpoint_had_is_refused(tmp_path, capsys):
    """Either way round: a checkpoint with admission/expiry state and a job without the feature, or the
    reverse, is refused naming the options (the run would not go on as the checkpointed one)."""
    ck = tmp_path / "ck"
    run_cli(tmp_path, "with", "--admit-after", "2", "--checkpoint-dir", str(ck))
    assert main([*SMALL, "--epochs", "2", "--checkpoint-dir", str(ck), "--resume"]) == 2
    assert "holds admission/expiry state: resume with the --admit-after" in capsys.readouterr().err
    plain = tmp_path / "plain"
    run_cli(tmp_path, "without", "--checkpoint-dir", str(plain))
    assert main([*SMALL, "--epochs", "2", "--admit-after", "2", "--checkpoint-dir", str(plain), "--resume"]) == 2
    assert "holds no admission/expiry state" in capsys.readouterr().err


def test_expire_after_below_the_residency_window_is_refused(capsys):
    assert main([*SMALL, "--expire-after", "2"]) == 2
    assert "--expire-after must be at least 3" in capsys.readouterr().err


def test_admission_needs_owner_sync(capsys):
    assert main([*SMALL, "--admit-after", "2", "--sparse-sync", "allreduce"]) == 2
    assert "need --sparse-sync owner" in capsys.readouterr().err
