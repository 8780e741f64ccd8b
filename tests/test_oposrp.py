"""OP+OSRP (hps.data._oposrp, seed 004 §2): a small example checked by hand, the seeded hash against
a big-integer reference of the four steps, the same seed giving the same hash in other processes
and on every rank, and --op-osrp in the trainer."""

import json
import subprocess
import sys

import numpy as np
import pytest

from hps.config import Config
from hps.data import op_osrp
from hps.data._oposrp import MERSENNE61, coefficients, hash_batch, hashed_key, project
from hps.data._synthetic import SyntheticData
from hps.errors import InvalidInputError
from hps.train import load_export, main

from .test_train_mpi import SMALL, compare, mpirun

M = MERSENNE61


def test_a_small_example_by_hand():
    """Identity permutation (a = 1, b = 0) and r = +1 for odd keys, -1 for even ones (c1 = 1): with
    k = 4 bins of width ceil(M / 4) = 2^59, key j W + v falls in bin j."""
    W = 2 ** 59
    keys = np.array([1, 3, 2 * W + 2,        # bin 0: +1 +1 -> z = 2 > 0 -> [0 1] = feature 1; bin 2: -1 -> feature 4
                     5, 6, 3 * W + 7,        # bin 0: +1 -1 -> z = 0 -> [0 0]; bin 3: +1 -> feature 7
                     ], np.uint64)            # example 2 has no key: every bin empty, [0 0] x 4
    offsets = np.array([0, 3, 6, 6])
    feat, off = project(keys, offsets, 4, (1, 0), (0, 1, 0, 0))
    assert feat.tolist() == [1, 4, 7] and off.tolist() == [0, 2, 3, 3]
    # a weight is the feature's value x_i: key 4 (even, -1) with weight 3 outweighs 1 + 1 in bin 0
    feat, _ = project(np.array([1, 3, 4], np.uint64), np.array([0, 3]), 4, (1, 0), (0, 1, 0, 0),
                      weights=np.array([1, 1, 3], np.float32))
    assert feat.tolist() == [0]
    # a permutation that is not the identity: pos = 2 x + 1 moves key W - 1 to 2 W - 1 (bin 1)
    feat, _ = project(np.array([W - 1], np.uint64), np.array([0, 1]), 4, (2, 1), (1, 0, 0, 0))
    assert feat.tolist() == [3]  # c0 = 1: odd, r = +1 -> 2 x 1 + 1


def reference(keys, offsets, bins, seed, weights):
    """The four steps of §2 with Python integers."""
    (a, b), c = (int(x) for x in coefficients(seed)[0]), [int(x) for x in coefficients(seed)[1]]
    width = -(-M // bins)
    feats, offs = [], [0]
    for i in range(len(offsets) - 1):
        z = {}
        for j in range(offsets[i], offsets[i + 1]):
            x = int(keys[j]) % M
            pos = (a * x + b) % M                                     # 1. permute
            k = pos // width                                           # 2. k bins
            h = (c[0] + c[1] * x + c[2] * x ** 2 + c[3] * x ** 3) % M   # 3. +-1 projection
            z[k] = z.get(k, 0.0) + (float(weights[j]) if h & 1 else -float(weights[j]))
        for k in sorted(z):                                            # 4. sign as two bits
            if z[k] != 0:
                feats.append(2 * k + (1 if z[k] > 0 else 0))
        offs.append(len(feats))
    return feats, offs


@pytest.mark.parametrize("bins", [1, 3, 64, 2 ** 10, 2 ** 18])
def test_seeded_hash_follows_the_four_steps(bins):
    rng = np.random.default_rng(bins)
    n = 300
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 12, size=n))])
    keys = rng.integers(0, 2 ** 63, size=offsets[-1], dtype=np.int64).view(np.uint64)
    keys[::7] = keys[0]                                   # repeated columns in an example add up
    weights = rng.choice([1.0, 1.0, 2.0, 0.5], size=offsets[-1]).astype(np.float32)
    feat, off = op_osrp(keys, offsets, bins, seed=12345, weights=weights)
    want, want_off = reference(keys, offsets, bins, 12345, weights)
    assert feat.tolist() == want and off.tolist() == want_off
    assert feat.dtype == np.int64 and ((feat >= 0) & (feat < 2 * bins)).all()
    other, _ = op_osrp(keys, offsets, bins, seed=12346, weights=weights)
    assert bins == 1 or other.tolist() != feat.tolist()   # another seed, another hash


def test_the_same_seed_gives_the_same_hash_in_another_process():
    code = ("import numpy as np, hashlib; from hps.data import op_osrp; "
            "k = np.arange(1, 5001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15); "
            "f, o = op_osrp(k, np.arange(0, 5001, 10), 1024, {seed}); "
            "print(hashlib.sha256(f.tobytes() + o.tobytes()).hexdigest())")
    run = lambda seed: subprocess.run([sys.executable, "-c", code.format(seed=seed)], capture_output=True,  # noqa: E731
                                      text=True, check=True).stdout.strip()
    k = np.arange(1, 5001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    import hashlib

    f, o = op_osrp(k, np.arange(0, 5001, 10), 1024, 7)
    here = hashlib.sha256(f.tobytes() + o.tobytes()).hexdigest()
    assert run(7) == run(7) == here != run(8)


def test_hash_batch_keeps_fields_labels_and_bounds_the_keys():
    data = SyntheticData(rows=2000, fields=5, vocab_per_field=500, n_dense=2, seed=1, batch_size=2000)
    b = next(iter(data.batches()))
    h = hash_batch(b, 16, seed=3)
    assert h.n_fields == 5 and (h.labels == b.labels).all() and (h.dense == b.dense).all()
    assert len(np.unique(h.keys)) <= 32 and (h.weights == 1).all()
    assert ((h.field >= 0) & (h.field < 5)).all()
    feat = (h.keys & np.uint64(2 ** 48 - 1)).astype(np.int64)
    np.testing.assert_array_equal(h.field, (feat // 2) * 5 // 16)   # bins cut into the fields in order
    np.testing.assert_array_equal(h.keys, hashed_key(h.field, feat))
    assert (np.diff(h.offsets) <= np.diff(b.offsets)).all()


def test_bad_bins_are_one_clear_error():
    with pytest.raises(InvalidInputError, match="op-osrp"):
        Config.from_flat({"op_osrp": 0})
    with pytest.raises(InvalidInputError, match="bins"):
        op_osrp(np.zeros(1, np.uint64), np.array([0, 1]), 0, 0)
    with pytest.raises(InvalidInputError, match="offsets"):
        op_osrp(np.zeros(2, np.uint64), np.array([0, 1]), 4, 0)


def test_trainer_hashes_training_and_eval_data(tmp_path):
    m = tmp_path / "m.json"
    assert main([*SMALL, "--op-osrp", "64", "--metrics-out", str(m)]) == 0
    got = json.loads(m.read_text())
    assert 0 < got["table_rows"] <= 128 and got["auc"] > 0.5
    full = tmp_path / "full.json"
    assert main([*SMALL, "--metrics-out", str(full)]) == 0
    assert json.loads(full.read_text())["table_rows"] > 10 * got["table_rows"]


@pytest.mark.mpi
def test_every_rank_hashes_alike(mpiexec, tmp_path):
    """2 ranks with --op-osrp end with the model of one process reading the same 2 shards."""
    args = [*SMALL, "--op-osrp", "256"]
    assert main([*args, "--data-shards", "2", "--export", str(tmp_path / "one")]) == 0
    proc = mpirun(mpiexec, 2, [*args, "--export", str(tmp_path / "two")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    compare(load_export(tmp_path / "one"), load_export(tmp_path / "two"), 1e-5)
