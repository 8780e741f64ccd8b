"""HashTable (CPU backend) and PartitionedHashTable against the dict model in tests/reference/table.py."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps import HashTable, HashTableFullError, HpsError, InvalidInputError, InvalidTypeError
from hps.gpu import PartitionedHashTable
from tests.reference.table import DictTable

SENTINEL = 2**64 - 1
# a small universe makes duplicates, revivals and collisions likely; includes the edge keys
UNIVERSE = [0, 1, 2, 3, 5, 8, 13, 2**63, 2**64 - 2, 12345678901234567890] + list(range(100, 140))

FACTORIES = {
    "cpu": lambda cap, dim, dtype: HashTable(cap, dim, device="cpu", dtype=dtype),
    "cpu-lf1": lambda cap, dim, dtype: HashTable(cap, dim, device="cpu", dtype=dtype, max_load_factor=1.0),
    "partitioned": lambda cap, dim, dtype: PartitionedHashTable(3, cap, dim, device="cpu", dtype=dtype,
                                                                part_capacity=cap),
}


def keys_of(idx):
    return np.array([UNIVERSE[i] for i in idx], dtype=np.uint64)


ops = st.lists(
    st.tuples(
        st.sampled_from(["insert", "accumulate", "get", "contains", "erase", "export", "clear", "reserve",
                         "purge", "find_write", "write_stale"]),
        st.lists(st.integers(0, len(UNIVERSE) - 1), max_size=24),
        st.integers(0, 2**31),
    ),
    max_size=30,
)


def assert_same_state(table, model):
    assert len(table) == len(model)
    k, v = table.export()
    order = np.argsort(k)
    mk, mv = model.export()
    np.testing.assert_array_equal(k[order], mk)
    np.testing.assert_array_equal(v[order], mv)


@pytest.mark.parametrize("kind", sorted(FACTORIES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@settings(max_examples=60, deadline=None)
@given(seq=ops, capacity=st.integers(1, 40))
def test_random_sequences_match_dict(kind, dtype, seq, capacity):
    dim = 3
    table, model = FACTORIES[kind](capacity, dim, dtype), DictTable(capacity, dim, dtype)
    found_before = None  # (keys, slots) of the last find_write: hints that later ops may make stale
    for op, idx, seed in seq:
        keys = keys_of(idx)
        # integer-valued rows keep float sums exact, so order of additions cannot matter
        rows = np.random.default_rng(seed).integers(-8, 8, (len(keys), dim)).astype(dtype)
        if op == "write_stale" and found_before is not None:  # slots of an earlier find: as insert
            keys, slots = found_before
            rows = rows[:0] if not len(keys) else np.resize(rows, (len(keys), dim)) if len(rows) else \
                np.full((len(keys), dim), seed % 7, dtype)
            try:
                model.insert(keys, rows)
            except HashTableFullError:
                with pytest.raises(HashTableFullError):
                    table.write_rows(keys, slots, rows)
            else:
                table.write_rows(keys, slots, rows)
        elif op == "find_write":  # the train step's find, then the write-back at the slots found
            got, slots = table.find_rows(keys)
            mv, mf = model.get(keys)
            np.testing.assert_array_equal(slots >= 0, mf)
            np.testing.assert_array_equal(got, mv)
            found_before = (keys, slots)
            if mf.all():
                table.write_rows(keys, slots, rows)
                model.insert(keys, rows)
        elif op in ("insert", "accumulate"):
            try:
                getattr(model, op)(keys, rows)
            except HashTableFullError:
                with pytest.raises(HashTableFullError):
                    getattr(table, op)(keys, rows)
            else:
                getattr(table, op)(keys, rows)
        elif op == "get":
            v, f = table.get(keys)
            mv, mf = model.get(keys)
            np.testing.assert_array_equal(f, mf)
            np.testing.assert_array_equal(v, mv)
        elif op == "contains":
            np.testing.assert_array_equal(table.contains(keys), model.contains(keys))
        elif op == "erase":
            assert table.erase(keys) == model.erase(keys)
        elif op == "clear":
            table.clear()
            model.clear()
        elif op == "reserve":
            new_capacity = seed % 48 + 1  # often below the capacity (a no-op), sometimes above
            table.reserve(new_capacity)
            model.reserve(new_capacity)
            assert table.capacity == model.capacity
        elif op == "purge":
            table.purge()
            model.purge()
        assert_same_state(table, model)


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_contention_closed_form(kind):
    """N copies of each of U keys accumulate integer deltas: every value is N/U * delta, exactly."""
    n, u, dim = 1 << 14, 64, 8
    table = FACTORIES[kind](u, dim, np.float32)
    keys = np.tile(np.arange(u, dtype=np.uint64), n // u)
    np.random.default_rng(0).shuffle(keys)
    table.accumulate(keys, np.full((n, dim), 3.0, np.float32))
    v, f = table.get(np.arange(u, dtype=np.uint64))
    assert f.all() and len(table) == u
    assert (v == 3.0 * n / u).all()


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_full_table_keeps_every_value(kind):
    cap, dim = 100, 4
    table = FACTORIES[kind](cap, dim, np.float32)
    keys = np.arange(cap, dtype=np.uint64)
    table.insert(keys, np.ones((cap, dim), np.float32))
    assert len(table) == cap
    before = table.export()
    more = np.arange(cap - 10, cap + 5, dtype=np.uint64)  # 10 present keys, 5 new ones
    with pytest.raises(HashTableFullError, match="capacity 100"):
        table.insert(more, np.full((15, dim), 7.0, np.float32))
    with pytest.raises(HashTableFullError):
        table.accumulate(more, np.full((15, dim), 7.0, np.float32))
    after = table.export()
    o1, o2 = np.argsort(before[0]), np.argsort(after[0])
    np.testing.assert_array_equal(before[0][o1], after[0][o2])
    np.testing.assert_array_equal(before[1][o1], after[1][o2])
    # present keys only: fits
    table.accumulate(keys[:10], np.ones((10, dim), np.float32))
    assert (table.get(keys[:10])[0] == 2).all()


def test_tombstones_are_purged_not_leaked():
    """Erase/insert churn far beyond the slot count never fills the table with tombstones."""
    table = HashTable(64, 2)
    for r in range(200):
        keys = np.arange(r * 64, r * 64 + 64, dtype=np.uint64)
        table.insert(keys, np.full((64, 2), r, np.float32))
        assert table.erase(keys[:60]) == 60
        v, f = table.get(keys[60:])
        assert f.all() and (v == r).all()
        table.erase(keys[60:])
    assert len(table) == 0


def test_duplicates_in_one_insert_last_wins():
    table = HashTable(10, 1)
    keys = np.array([7, 7, 7, 3], dtype=np.uint64)
    table.insert(keys, np.array([[1.0], [2.0], [3.0], [4.0]], np.float32))
    v, _ = table.get(np.array([7, 3], dtype=np.uint64))
    assert v[:, 0].tolist() == [3.0, 4.0] and len(table) == 2


def test_int64_keys_are_reinterpreted():
    table = HashTable(10, 2)
    table.insert(np.array([-2, 5], dtype=np.int64), np.ones((2, 2)))
    assert table.contains(np.array([2**64 - 2, 5], dtype=np.uint64)).all()


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_find_rows_sentinel_absent_write_rows_refuses(kind):
    """The train step's find_rows / write_rows skip the sentinel scan (their keys were validated where
    they entered) yet stay safe: the sentinel is never live (parts: find_rows is their ``get``, which
    refuses it), and writing it is refused (typed) with the table unchanged, whatever slot comes with it."""
    table = FACTORIES[kind](10, 2, np.float32)
    table.insert(np.array([1, 2], np.uint64), np.ones((2, 2), np.float32))
    keys = np.array([1, SENTINEL, 2], np.uint64)
    if kind == "partitioned":
        with pytest.raises(InvalidInputError, match="sentinel"):
            table.find_rows(keys)
        slots = np.array([0, -1, 0], np.int64)
    else:
        rows, slots = table.find_rows(keys)
        assert slots[1] == -1 and (slots[[0, 2]] >= 0).all()
        np.testing.assert_array_equal(rows, [[1, 1], [0, 0], [1, 1]])
    before = table.export()
    for bad_slots in (slots, np.zeros(3, np.int64), np.full(3, 1 << 40, np.int64)):
        with pytest.raises(InvalidInputError, match="sentinel"):
            table.write_rows(keys, bad_slots, np.full((3, 2), 5, np.float32))
        after = table.export()
        np.testing.assert_array_equal(np.sort(before[0]), np.sort(after[0]))
        np.testing.assert_array_equal(before[1][np.argsort(before[0])], after[1][np.argsort(after[0])])
    with pytest.raises(InvalidInputError, match="slots"):
        table.write_rows(keys[:2], slots, np.ones((2, 2), np.float32))


def test_write_rows_wrong_slots_write_by_key():
    """Slots that do not hold their keys (out of the table, another key's, a re-laid table's) make
    write_rows an insert: the rows land at their keys, no other row changes."""
    table = HashTable(100, 3)
    keys = np.arange(50, dtype=np.uint64)
    table.insert(keys, np.zeros((50, 3), np.float32))
    _, slots = table.find_rows(keys[:10])
    table.erase(keys[40:])
    table.purge()  # re-lays the live keys: the slots found before are stale
    new = np.arange(30, dtype=np.float32).reshape(10, 3)
    for hint in (slots, slots[::-1].copy(), np.full(10, -1, np.int64), np.full(10, 1 << 40, np.int64)):
        table.write_rows(keys[:10], hint, new)
        got, found = table.get(keys[:40])
        assert found.all() and len(table) == 40
        np.testing.assert_array_equal(got[:10], new)
        assert (got[10:] == 0).all()
        new = new + 1


@pytest.mark.parametrize("bad", [np.array([SENTINEL], np.uint64), np.array([-1], np.int64)])
def test_sentinel_key_rejected(bad):
    table = HashTable(10, 2)
    with pytest.raises(InvalidInputError, match="sentinel"):
        table.insert(bad, np.ones((1, 2)))
    with pytest.raises(ValueError):
        table.get(bad)
    assert len(table) == 0


def test_bad_shapes_and_dtypes():
    table = HashTable(10, 2)
    with pytest.raises(InvalidInputError, match=r"shape \(2, 2\)"):
        table.insert(np.arange(2, dtype=np.uint64), np.ones((2, 3)))
    with pytest.raises(InvalidTypeError, match="uint64"):
        table.get(np.array([1.5]))
    with pytest.raises(InvalidInputError, match="1-D"):
        table.get(np.ones((2, 2), dtype=np.uint64))
    with pytest.raises(TypeError):
        table.insert(np.arange(2, dtype=np.uint64), np.array([["a", "b"], ["c", "d"]]))
    for kwargs in ({"capacity": 0, "dim": 2}, {"capacity": 5, "dim": 0},
                   {"capacity": 5, "dim": 2, "max_load_factor": 1.5}):
        with pytest.raises(InvalidInputError):
            HashTable(**kwargs)
    with pytest.raises(InvalidTypeError):
        HashTable(5, 2, dtype=np.int32)
    with pytest.raises(InvalidInputError, match="device"):
        HashTable(5, 2, device="tpu")
    assert issubclass(HashTableFullError, HpsError)


def test_empty_batches_are_noops():
    table = HashTable(10, 2)
    empty = np.empty(0, dtype=np.uint64)
    table.insert(empty, np.empty((0, 2)))
    table.accumulate(empty, np.empty((0, 2)))
    v, f = table.get(empty)
    assert v.shape == (0, 2) and f.shape == (0,)
    assert table.erase(empty) == 0 and len(table) == 0


def test_properties():
    table = HashTable(1000, 16, dtype=np.float64, max_load_factor=0.5)
    assert table.capacity == 1000 and table.dim == 16 and table.device == "cpu"
    assert table.dtype == np.float64 and table.n_slots == 2048
    table.insert(np.arange(512, dtype=np.uint64), np.zeros((512, 16)))
    assert table.load_factor == 0.25
    assert "size=512" in repr(table)


def test_nan_and_inf_values_are_stored_verbatim():
    table = HashTable(4, 3)
    rows = np.array([[np.nan, np.inf, -np.inf]], np.float32)
    table.insert(np.array([1], np.uint64), rows)
    v, _ = table.get(np.array([1], np.uint64))
    np.testing.assert_array_equal(v, rows)


def test_partitioned_matches_single_on_large_random_batch():
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**63, 20000, dtype=np.uint64)
    deltas = rng.integers(-4, 4, (20000, 8)).astype(np.float32)
    single, parted = HashTable(30000, 8), PartitionedHashTable(4, 30000, 8)
    for t in (single, parted):
        t.accumulate(keys, deltas)
        t.accumulate(keys[::3], deltas[::3])
    probe = np.concatenate([keys[:5000], rng.integers(0, 2**63, 100, dtype=np.uint64)])
    np.testing.assert_array_equal(single.get(probe)[0], parted.get(probe)[0])
    np.testing.assert_array_equal(single.contains(probe), parted.contains(probe))
    assert len(single) == len(parted)
    assert single.erase(keys[:100]) == parted.erase(keys[:100])


def test_partitioned_part_overflow_changes_nothing():
    parted = PartitionedHashTable(2, 100, 2, part_capacity=10)
    keys = np.arange(40, dtype=np.uint64)
    with pytest.raises(HashTableFullError):
        parted.insert(keys, np.ones((40, 2)))
    assert len(parted) == 0 and all(len(p) == 0 for p in parted.parts)


def test_get_into_a_caller_buffer():
    table = HashTable(10, 2)
    table.insert(np.array([1, 2], np.uint64), np.array([[1, 1], [2, 2]], np.float32))
    buf = np.full((3, 2), 9, np.float32)
    vals, found = table.get(np.array([2, 5, 1], np.uint64), out=buf)
    assert vals is buf and buf.tolist() == [[2, 2], [0, 0], [1, 1]] and found.tolist() == [True, False, True]
    with pytest.raises(InvalidInputError, match="shape"):
        table.get(np.array([1], np.uint64), out=buf)
    with pytest.raises(InvalidTypeError):
        table.get(np.array([1], np.uint64), out=np.zeros((1, 2), np.float64))


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_reserve_grows_a_full_table_and_keeps_every_entry(kind):
    cap, dim = 50, 3
    table = FACTORIES[kind](cap, dim, np.float32)
    keys = np.arange(cap, dtype=np.uint64) * np.uint64(977)
    rows = np.arange(cap * dim, dtype=np.float32).reshape(cap, dim)
    table.insert(keys, rows)
    table.erase(keys[:5])
    table.insert(keys[:5], rows[:5])  # revived tombstones
    more = np.arange(1, 31, dtype=np.uint64)
    with pytest.raises(HashTableFullError):
        table.insert(more, np.ones((30, dim)))
    table.reserve(cap)  # not above the capacity: nothing to do
    assert table.capacity == cap
    table.reserve(cap + 30)
    assert table.capacity == cap + 30
    v, f = table.get(keys)
    assert f.all()
    np.testing.assert_array_equal(v, rows)
    table.insert(more, np.ones((30, dim)))
    assert len(table) == cap + 30
    with pytest.raises(HashTableFullError):
        table.insert(np.array([10**9], np.uint64), np.ones((1, dim)))
    with pytest.raises(InvalidInputError):
        table.reserve(0)


def test_reserve_grows_the_slot_array_and_drops_tombstones():
    table = HashTable(100, 2)
    assert table.n_slots == 256
    keys = np.arange(100, dtype=np.uint64)
    table.insert(keys, np.ones((100, 2)))
    table.erase(keys[:40])
    g = table.generation
    table.reserve(129)  # 129 / 0.5 > 256: the slot array doubles
    assert table.n_slots == 512 and table.generation == g + 1
    assert table._tombstones == 0 and table._impl.tombstones == 0
    assert len(table) == 60 and table.contains(keys[40:]).all() and not table.contains(keys[:40]).any()
    table.reserve(200)  # still 512 slots: capacity changes, entries do not move
    assert table.n_slots == 512 and table.capacity == 200 and table.generation == g + 1


def test_purge_and_insert_churn_never_export_the_table(monkeypatch):
    """Tombstones are purged in place: neither an explicit purge nor the purge an insert triggers
    goes through export (for the CUDA table, export is the host round trip)."""
    table = HashTable(64, 2)

    def no_export(*a):
        raise AssertionError("export called by a purge")

    monkeypatch.setattr(table._impl, "export", no_export)
    keys = np.arange(64, dtype=np.uint64)
    table.insert(keys, np.ones((64, 2)))
    table.erase(keys[:60])
    g = table.generation
    table.purge()
    assert table.generation == g + 1 and table._tombstones == 0
    table.purge()  # no tombstones: nothing moves
    assert table.generation == g + 1
    for r in range(1, 20):  # churn: inserts must purge by themselves
        new = np.arange(r * 1000, r * 1000 + 60, dtype=np.uint64)
        table.insert(new, np.full((60, 2), r, np.float32))
        table.erase(new)
    assert table.generation > g + 1
    v, f = table.get(keys[60:])
    assert f.all() and (v == 1).all() and len(table) == 4


def test_device_view_holds_the_lock_and_forbids_moves():
    table = HashTable(8, 2)
    table.insert(np.array([5], np.uint64), np.array([[1.0, 2.0]], np.float32))
    with table.device_view() as v:
        assert v.generation == table.generation
        s = int(np.flatnonzero(v.keys == 5)[0])
        assert v.state[s] == 0 and v.values[s].tolist() == [1.0, 2.0]
        v.values[s] += 1  # a kernel updating a live row in place
        for op in (table.purge, table.clear, lambda: table.reserve(100)):
            with pytest.raises(InvalidInputError, match="device_view"):
                op()
    assert table.get(np.array([5], np.uint64))[0].tolist() == [[2.0, 3.0]]
    table.reserve(100)  # allowed again once the view is closed


def test_partitioned_reserve_and_purge():
    parted = PartitionedHashTable(2, 20, 2)
    keys = np.arange(20, dtype=np.uint64)
    parted.insert(keys, np.ones((20, 2)))
    parted.erase(keys[:10])
    parted.purge()
    assert all(p._tombstones == 0 for p in parted.parts)
    parted.reserve(200)
    assert parted.capacity == 200 and all(p.capacity >= 189 for p in parted.parts)
    more = np.arange(100, 280, dtype=np.uint64)
    parted.insert(more, np.ones((180, 2)))
    assert len(parted) == 190 and parted.contains(more).all()


def test_cpu_table_faults_its_slot_arrays_in_when_built():
    """A CPU table writes its slot arrays at construction (as the CUDA table zeroes them), so the first
    inserts into a fresh table fault no page in: with lazily mapped zero pages, a batch's inserts
    scattered over the slots faulted in every page of the rows at first touch, the cost that made
    ``bench.bench_host`` 10x slower in some runs than in others (the first touch of fresh memory on the
    VM)."""
    import resource

    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    dim, cap = 64, 1 << 17                              # 2**18 slots: 64 MiB of rows
    keys = np.arange(1, cap // 8 + 1, dtype=np.uint64)  # hashed all over the slots (one per 4 KiB)
    rows = np.ones((keys.shape[0], dim), np.float32)
    HashTable(16, dim, device="cpu").insert(keys[:4], rows[:4])   # kernels compiled and loaded
    table = HashTable(cap, dim, device="cpu")
    before = faults()
    table.insert(keys, rows)
    touched = faults() - before
    # lazily mapped: >= 32 faults (2 MiB huge pages) up to 16,384 (4 KiB pages) for the 64 MiB of rows
    assert touched < 8, f"{touched} page faults while inserting into a new table"
    got, found = table.get(keys[::4096])
    assert found.all() and (got == 1).all()


def test_arguments_that_are_no_numbers_and_capacities_no_machine_holds_are_typed_errors():
    from hps.errors import InvalidInputError

    for args in (("abc", 2), (float("inf"), 2), (4, 0), (2.5, 2)):
        with pytest.raises(InvalidInputError, match="must be a positive integer"):
            HashTable(*args)
    with pytest.raises(InvalidInputError, match="max_load_factor"):
        HashTable(4, 2, max_load_factor="x")
    with pytest.raises(InvalidInputError, match="more than this machine can allocate"):
        HashTable(2**62, 2)
    t = HashTable(4, 2)
    t.insert(np.arange(3, dtype=np.uint64), np.ones((3, 2), np.float32))
    with pytest.raises(InvalidInputError, match="the table is unchanged"):
        t.reserve(2**62)
    with pytest.raises(InvalidInputError, match="must be a positive integer"):
        t.reserve("x")
    assert len(t) == 3 and t.get(np.arange(3, dtype=np.uint64))[1].all()
    for args in (("x", 4, 2), (2, "abc", 2), (0, 4, 2)):   # the partitioned table checks alike
        with pytest.raises(InvalidInputError, match="must be a positive integer"):
            PartitionedHashTable(*args)
