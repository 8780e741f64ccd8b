"""``hps.mem.unique_counts``, ``unique_keys`` and ``unique_segments`` (the host's dedup: prepare plans,
MEM-PS pulls) against a NumPy reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.mem import unique_counts, unique_keys


def reference(keys):
    """(distinct keys in first-occurrence order, their counts, the inverse) with np.unique."""
    u, first, inv, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.shape[0])
    return u[order], counts[order], rank[inv.ravel()]


def check(keys):
    keys = np.asarray(keys, dtype=np.uint64)
    u, c, inv = unique_counts(keys)
    ru, rc, rinv = reference(keys)
    assert u.dtype == np.uint64 and c.dtype == np.int64 and inv.dtype == np.int64
    np.testing.assert_array_equal(u, ru)
    np.testing.assert_array_equal(c, rc)
    np.testing.assert_array_equal(inv, rinv)
    np.testing.assert_array_equal(unique_keys(keys), ru)


@pytest.mark.parametrize("keys", [[], [7], [0], [3] * 1000, [5, 3, 5, 5, 7, 3]],
                         ids=["empty", "one", "zero", "all-dup", "small"])
def test_edge_cases(keys):
    check(keys)


def test_all_ones_is_a_key():
    """The all-ones key (the tables' EMPTY_KEY) is counted like any other: the table holds indices,
    not keys, so no key value is a sentinel."""
    e = np.uint64(0xFFFFFFFFFFFFFFFF)
    check([e, 1, e, 2, 1, e])
    check([e])


@pytest.mark.parametrize("n, vocab", [(100_000, 30_000), (300_000, 10 ** 12), (70_000, 3)])
def test_large_batches(n, vocab):
    """Past the prefetch distance and many probes long: mini-batch and union shapes."""
    rng = np.random.default_rng(n)
    check(rng.integers(0, vocab, size=n, dtype=np.uint64))


def test_colliding_keys():
    """Keys of one home cell (the low 16 hash bits alike: one home in any table up to 65,536 cells)
    chain through one probe run as long as they are many."""
    from hps.mem._unique import _cells
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2 ** 63, size=4_000_000, dtype=np.uint64)
    h = mix64_all(keys)
    same = keys[(h & np.uint64(0xFFFF)) == (h[0] & np.uint64(0xFFFF))]
    assert same.shape[0] >= 40
    batch = np.concatenate([same, same[::-1], keys[:500]])
    m = _cells(batch.shape[0])
    assert m <= 1 << 16
    homes = mix64_all(batch) & np.uint64(m - 1)
    assert np.bincount(homes.astype(np.int64), minlength=m).max() >= same.shape[0]  # one home: one run
    check(batch)


def mix64_all(keys):
    """SplitMix64's finaliser (``hps._hashing.mix64``) over an array, in NumPy."""
    z = keys.copy()
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2 ** 64 - 1) | st.integers(0, 9), max_size=60))
def test_matches_numpy(keys):
    check(keys)


def check_segments(keys, bounds):
    from hps.mem import unique_segments
    keys, bounds = np.asarray(keys, dtype=np.uint64), np.asarray(bounds, dtype=np.int64)
    uniq, ub, inv = unique_segments(keys, bounds)
    assert uniq.dtype == np.uint64 and ub.dtype == np.int64 and inv.dtype == np.int64
    assert ub.shape == bounds.shape and inv.shape == (bounds[-1] - bounds[0],)
    for j in range(bounds.shape[0] - 1):
        ru, _, rinv = reference(keys[bounds[j]:bounds[j + 1]])
        np.testing.assert_array_equal(uniq[ub[j]:ub[j + 1]], ru)
        np.testing.assert_array_equal(inv[bounds[j] - bounds[0]:bounds[j + 1] - bounds[0]], rinv)
    assert uniq.shape == (ub[-1],)


@pytest.mark.parametrize("keys, bounds", [
    ([], [0]), ([], [0, 0]), ([7], [0, 1]), ([3] * 50, [0, 10, 10, 50]), ([5, 3, 5, 5, 7, 3], [1, 4, 6]),
    ([2 ** 64 - 1, 1, 2 ** 64 - 1, 1], [0, 2, 4])], ids=["none", "empty", "one", "dup-and-empty-segment",
                                                         "offset", "all-ones-key"])
def test_segments_edge_cases(keys, bounds):
    check_segments(keys, bounds)


def test_segments_share_keys_and_reuse_the_table():
    """Mini-batches of one batch: keys recur across segments (each segment counts them anew) and the
    table's cells of one segment are reset before the next."""
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 40_000, size=16 * 6_000, dtype=np.uint64)
    check_segments(keys, np.r_[np.arange(0, keys.shape[0], 6_000), keys.shape[0]])
    check_segments(keys, [0, 5, 90_000, 90_001, keys.shape[0]])


def test_segments_refuse_bad_bounds():
    from hps.errors import InvalidInputError
    from hps.mem import unique_segments
    keys = np.arange(10, dtype=np.uint64)
    for bounds in ([0, 11], [5, 3], [-1, 4]):
        with pytest.raises(InvalidInputError):
            unique_segments(keys, np.array(bounds))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 2 ** 64 - 1) | st.integers(0, 5), max_size=40), st.data())
def test_segments_match_numpy(keys, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(keys)), max_size=5)))
    check_segments(keys, [0, *cuts, len(keys)])


@pytest.mark.parametrize("fn", ["unique_counts", "unique_keys", "unique_segments"])
def test_refuse_bad_keys(fn):
    """Keys not 1-D uint64 are refused with typed errors (no AttributeError, no other kernel version);
    a list and int64 keys (read bitwise) are keys."""
    import hps.mem as mem
    from hps.errors import InvalidInputError, InvalidTypeError
    f = getattr(mem, fn)

    def call(keys):
        return f(keys, [0, np.asarray(keys).reshape(-1).shape[0]]) if fn == "unique_segments" else f(keys)
    with pytest.raises(InvalidInputError, match="1-D"):
        call(np.zeros((2, 3), dtype=np.uint64))
    for dtype in (np.float64, np.int32, np.uint32):
        with pytest.raises(InvalidTypeError, match="uint64"):
            call(np.arange(4, dtype=dtype))
    got = call([5, 3, 5]) if fn == "unique_keys" else call([5, 3, 5])[0]  # a list of ints: int64 keys
    np.testing.assert_array_equal(got, np.array([5, 3], dtype=np.uint64))
    signed = np.array([-1, 3, -1], dtype=np.int64)
    got = call(signed) if fn == "unique_keys" else call(signed)[0]
    np.testing.assert_array_equal(got, np.array([2 ** 64 - 1, 3], dtype=np.uint64))


def test_segments_refuse_bad_bounds_shape_and_type():
    """bounds must be (P + 1,) integer, P >= 0; the message gives lengths, never the array."""
    from hps.errors import InvalidInputError, InvalidTypeError
    from hps.mem import unique_segments
    keys = np.arange(10, dtype=np.uint64)
    with pytest.raises(InvalidInputError, match="P >= 0"):
        unique_segments(keys, np.empty(0, dtype=np.int64))
    with pytest.raises(InvalidInputError, match="1-D|P >= 0"):
        unique_segments(keys, np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(InvalidTypeError, match="integer"):
        unique_segments(keys, np.array([0.0, 4.0]))
    bounds = np.r_[np.arange(0, 9), 123_456_789]
    with pytest.raises(InvalidInputError) as err:
        unique_segments(keys, bounds)
    assert "123456789" not in str(err.value) and "10 bounds" in str(err.value)


def test_unique_bytes_is_what_a_call_holds():
    """``unique_bytes`` (which ``hps.train._budget.pipeline_bytes`` counts) is the peak a call
    allocates (tracemalloc sees NumPy's arrays), by each function's own sizing rule."""
    import tracemalloc

    from hps.mem import unique_segments
    from hps.mem._unique import unique_bytes
    from hps.train._budget import pipeline_bytes
    keys = np.random.default_rng(5).integers(0, 1 << 40, size=300_000, dtype=np.uint64)
    bounds = np.arange(0, keys.shape[0] + 1, 30_000)
    unique_counts(keys[:20]), unique_segments(keys[:20], [0, 10, 20])  # compiled before measuring
    for call, est in ((lambda: unique_counts(keys), unique_bytes(keys.shape[0])),
                      (lambda: unique_segments(keys, bounds), unique_bytes(keys.shape[0], 30_000))):
        tracemalloc.start()
        call()
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert est <= peak <= est + 4096
    assert (pipeline_bytes(0, 1, 0, 0, 4, 1, 0, batch_keys=keys.shape[0]) - pipeline_bytes(0, 1, 0, 0, 4, 1, 0)
            == unique_bytes(keys.shape[0]))


def test_scratch_gives_the_results_of_fresh_tables():
    """A DedupScratch kept across calls of growing and shrinking sizes, both dedups interleaved (a
    prepare stage's batches): every result equals the NumPy reference, and the table is free (-1
    filled) after every call."""
    from hps.mem import DedupScratch, unique_segments
    scratch = DedupScratch()
    rng = np.random.default_rng(5)
    for n, vocab, parts in [(50_000, 8_000, 4), (3, 2, 1), (200_000, 10 ** 12, 16), (1_000, 30, 3), (0, 1, 1),
                            (120_000, 50_000, 7)]:
        keys = rng.integers(0, vocab, size=n, dtype=np.uint64)
        bounds = np.linspace(0, n, parts + 1).astype(np.int64)
        uniq, ub, inv = unique_segments(keys, bounds, scratch)
        fresh = unique_segments(keys, bounds)
        for got, want in zip((uniq, ub, inv), fresh):
            np.testing.assert_array_equal(got, want)
        for j in range(parts):
            ru, _, rinv = reference(keys[bounds[j]:bounds[j + 1]])
            np.testing.assert_array_equal(uniq[ub[j]:ub[j + 1]], ru)
            np.testing.assert_array_equal(inv[bounds[j]:bounds[j + 1]], rinv)
        np.testing.assert_array_equal(unique_keys(uniq, scratch), reference(keys)[0])
        for tab in scratch._tab.values():
            assert (tab == -1).all()
