"""The HBM-PS grows between batches: a table sized far below a batch's working set (``--hbm-capacity``,
or a first batch smaller than the later ones) no longer fails mid-run with HashTableFullError; the
job ends with the model of a job whose table never had to grow."""

import json

import numpy as np

from hps import HashTable
from hps.train import load_export, main
from hps.train._hierarchy import ParameterHierarchy

JOB = ["--rows", "3000", "--fields", "3", "--vocab-per-field", "400", "--batch-size", "500",
       "--minibatch-size", "125", "--hidden", "8", "--embedding-dim", "4", "--no-progress"]


def run(tmp_path, name, *extra):
    out, metrics = tmp_path / name, tmp_path / f"{name}.json"
    assert main([*JOB, "--export", str(out), "--metrics-out", str(metrics), *extra]) == 0
    return load_export(out), json.loads(metrics.read_text())


def test_a_table_far_too_small_grows_and_trains_the_same_model(tmp_path):
    (kb, vb, db), mb = run(tmp_path, "base")
    (kg, vg, dg), mg = run(tmp_path, "grown", "--hbm-capacity", "16")
    assert max(mg["resident_rows"]) > 16  # the working sets needed the growth
    ob, og = np.argsort(kb), np.argsort(kg)
    np.testing.assert_array_equal(kb[ob], kg[og])
    np.testing.assert_array_equal(vb[ob], vg[og])
    for name in db:
        np.testing.assert_array_equal(db[name], dg[name])


class _Rows:
    """The MEM-PS side of a hierarchy in these tests: rows born as the key's value, pushes recorded."""

    row_width, dtype = 2, np.dtype(np.float32)

    def __init__(self, capacity_rows=1 << 20):
        self.cache = type("Cache", (), {"capacity_rows": capacity_rows, "budget_bytes": capacity_rows * 8})()
        self.pushed = []

    def take(self, keys, out=None, at=None):
        rows = np.repeat(keys.astype(np.float32)[:, None], 2, axis=1)
        if out is None:
            return rows
        out[at] = rows
        return out

    def push(self, keys, rows, unpin=False, distinct=False, at=None, absent=False):
        """``MemPS.push``'s interface: the row of ``keys[i]`` is ``rows[at[i]]`` (``at`` None: ``rows[i]``)."""
        self.pushed.append((keys.copy(), rows.copy() if at is None else rows[at]))

    def flush(self):
        return 0


def test_prepare_grows_the_table_only_when_the_rows_may_not_fit():
    table = HashTable(4, 2)
    hier = ParameterHierarchy(table, _Rows(), window=3, owned_mask=lambda k: np.ones(k.shape[0], bool))
    keys = np.arange(1, 4, dtype=np.uint64)
    hier.prepare(0, keys)
    assert table.capacity == 4
    more = np.arange(10, 13, dtype=np.uint64)
    hier.prepare(1, more)
    assert table.capacity == 8 and len(table) == 6  # doubled: growth is amortised
    got, found = table.get(np.concatenate([keys, more]))
    assert found.all() and (got[:, 0] == np.concatenate([keys, more])).all()


def _widening_criteo(path, n=2000):
    """A Criteo TSV file whose first half sets one categorical field of ten values and whose second
    half sets all 26 with values seen once: later batches touch ~26 x more keys than the first."""
    rng = np.random.default_rng(0)
    lines = []
    for i in range(n):   # writing a test file, not a hot path
        cats = [f"{rng.integers(10):08x}"] + [""] * 25 if i < n // 2 else [f"{i * 26 + f:08x}" for f in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.3)), *[""] * 13, *cats]))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_default_cpu_budget_follows_a_working_set_bigger_than_the_first(tmp_path):
    data = _widening_criteo(tmp_path / "train.txt")
    job = ["--format", "criteo", "--data", str(data), "--batch-size", "250", "--minibatch-size", "125",
           "--embedding-dim", "4", "--hidden", "8", "--no-progress"]
    runs = {}
    for name, extra in {"default": [], "big": ["--hbm-budget", "64MiB"]}.items():
        out, metrics = tmp_path / name, tmp_path / f"{name}.json"
        assert main([*job, *extra, "--export", str(out), "--metrics-out", str(metrics)]) == 0
        runs[name] = load_export(out), json.loads(metrics.read_text())
    (kd, vd, dd), md = runs["default"]
    (kb, vb, db), mb = runs["big"]
    # the first batch planned ~1 k rows; the second half's batches hold 250 x 26 keys each
    assert md["hbm_budget_rows"][0] >= 2 * 4 * 250 * 26
    od, ob = np.argsort(kd), np.argsort(kb)
    np.testing.assert_array_equal(kd[od], kb[ob])
    np.testing.assert_array_equal(vd[od], vb[ob])
    for name in dd:
        np.testing.assert_array_equal(dd[name], db[name])


def test_a_budget_that_follows_the_working_sets_only_rises():
    table = HashTable(4, 2)
    hier = ParameterHierarchy(table, _Rows(), window=3, owned_mask=lambda k: np.ones(k.shape[0], bool),
                              budget_rows=6, budget_for=lambda n: 2 * n)
    hier.prepare(0, np.arange(1, 9, dtype=np.uint64))   # 8 keys: over 6, the budget follows
    assert hier.budget_rows == 16 and len(table) == 8
    hier.mark_trained(0)
    hier.prepare(1, np.arange(20, 23, dtype=np.uint64))
    assert hier.budget_rows == 16 and hier.evicted == 0


def test_growth_takes_all_the_keys_its_slot_array_holds():
    """A table grown for 10 keys takes 32 slots, which hold 16 at the default load factor: its capacity
    is 16, so 15 keys fit without a second growth (asked for exactly 10, it grew again at 15 into 64
    slots, and a job's twin ended twice the size its keys needed)."""
    table = HashTable(4, 2)
    hier = ParameterHierarchy(table, _Rows(), window=3, owned_mask=lambda k: np.ones(k.shape[0], bool))
    hier.prepare(0, np.arange(1, 4, dtype=np.uint64))
    hier.prepare(1, np.arange(10, 17, dtype=np.uint64))     # 10 keys: more than twice the capacity of 4
    assert table.capacity == 16 and len(table) == 10
    hier.prepare(2, np.arange(20, 25, dtype=np.uint64))     # 15 keys
    assert table.capacity == 16 and len(table) == 15  # no second growth
    keys = np.concatenate([np.arange(1, 4), np.arange(10, 17), np.arange(20, 25)]).astype(np.uint64)
    got, found = table.get(keys)
    assert found.all() and (got[:, 0] == keys).all()
