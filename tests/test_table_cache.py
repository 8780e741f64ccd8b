"""``HashTable`` as the HBM-PS cache across batches on the CPU (``hps/table/_cache.py``): scores counted
by ``lookup``, victims by ``evict``, against the dict model of ``tests/reference/hbm_cache.py``; and the
device dedup's host twin (``hps.gpu.unique_inverse`` on NumPy) against ``hps.mem.unique_counts``."""

import numpy as np
import pytest

from hps import HashTable
from hps.errors import InvalidInputError
from hps.gpu import missing_keys, unique_inverse, unique_keys
from hps.mem import unique_counts
from tests.reference.hbm_cache import ScoredDict, assert_same, random_ops, replay


@pytest.mark.parametrize("seed", range(12))
def test_random_cache_sequences_match_the_model(seed):
    ops = random_ops(seed)
    assert_same(replay(HashTable(8, 3, max_load_factor=0.75), ops), replay(ScoredDict(3), ops))


def test_closed_form_victims_least_used_then_least_recent_then_smaller_key():
    t = HashTable(64, 1)
    keys = np.arange(1, 11, dtype=np.uint64)
    t.insert(keys, keys.astype(np.float32)[:, None])
    t.lookup(keys[:6], 1)        # 1..6 used once, in batch 1
    t.lookup(keys[:3], 2)        # 1..3 twice, last in batch 2
    t.lookup(keys[8:], 3)        # 9, 10 once, in batch 3 (protected below)
    k, r = t.evict(5, protect_from=3)
    # unused 7, 8 first; then once-used 4, 5, 6 (batch 1): five victims, 9 and 10 protected
    assert k.tolist() == [4, 5, 6, 7, 8] and r[:, 0].tolist() == [4, 5, 6, 7, 8]
    assert len(t) == 5 and t.contains(keys).tolist() == [True] * 3 + [False] * 5 + [True] * 2
    k, _ = t.evict(10, protect_from=3)
    assert k.tolist() == [1, 2, 3]  # all that is eligible
    assert t.evict(3, protect_from=4)[0].tolist() == [9, 10] and len(t) == 0


def _victims_by_full_sort(tkeys, tstate, tscore, protect, n):
    """The NumPy reference of ``victim_slots``: the n first eligible slots in ascending (score, key)."""
    ok = (tkeys != np.uint64(0xFFFFFFFFFFFFFFFF)) & (tstate == 0) & ((tscore & np.uint64(0xFFFFFFFF)) < protect)
    elig = np.flatnonzero(ok)
    return elig[np.lexsort((tkeys[elig], tscore[elig]))][:n]


def _table(rng, S, n_live, keys, count, last):
    """(tkeys, tstate, tscore) of S slots, ``n_live`` of them holding ``keys`` (a tenth of those
    tombstones), scores ``(count << 32) | last`` on every slot (the kernel must look at liveness)."""
    tkeys = np.full(S, 0xFFFFFFFFFFFFFFFF, np.uint64)
    live = rng.choice(S, n_live, replace=False)
    tkeys[live] = keys
    tstate = np.zeros(S, np.int32)
    tstate[live[:n_live // 10]] = 1
    tscore = (np.asarray(count, np.uint64) << np.uint64(32)) | np.asarray(last, np.uint64)
    return tkeys, tstate, np.broadcast_to(tscore, (S,)).copy()


def _adversarial(seed):
    """(name, tkeys, tstate, tscore, protect): tables that defeat a selection's shortcuts."""
    rng = np.random.default_rng(seed)
    S, n = 4099, 3000                                   # not a multiple of 4: the histogram's tail
    spread = rng.choice(np.uint64(1) << np.uint64(62), n, replace=False).astype(np.uint64)
    close = np.uint64(0xFFFFFFFFFFFF0000) - rng.choice(1 << 16, n, replace=False).astype(np.uint64)
    top = np.uint64(2**32 - 1)
    return [
        ("all scores equal, keys spread", *_table(rng, S, n, spread, 3, 5), 7),
        ("all scores equal, keys alike but for the low bits", *_table(rng, S, n, close, 1, 0), 1),
        ("counts at and past the first digit's 255", *_table(rng, S, n, spread, rng.integers(250, 1 << 20, S),
                                                                rng.integers(0, 9, S)), 9),
        ("saturated counts, last batches far before protect",
         *_table(rng, S, n, close, rng.choice([top, top - np.uint64(1)], S), rng.integers(0, 10**6, S)), 10**6),
        ("protect at the batch limit, any score", *_table(rng, S, n, spread, rng.integers(0, 2**32, S),
                                                         rng.integers(0, 2**32 - 1, S)), 2**32 - 1),
        ("unused keys (score 0) beside used ones", *_table(rng, S, n, spread, rng.integers(0, 2, S), 0), 1),
        ("every key protected", *_table(rng, S, n, spread, 2, 7), 7),
    ]


def _victims(tkeys, tstate, tscore, protect, n, scored=False):
    """``victim_slots`` with every hint its first pass can take (none; far ones, whose gathered slots
    do not hold the threshold or hold every eligible slot; the threshold's digit t of the first call,
    and t - NEAR_DIGITS, t - NEAR_DIGITS - 1: the gathered digits end at, then just below it) -> the
    sorted slots, asserted equal under every hint."""
    from hps.table._cache_kernels_cpu import NEAR_DIGITS, victim_slots

    answers, first = [], None
    for h in (-1, 0, 200, 65535, 0, NEAR_DIGITS, NEAR_DIGITS + 1):
        if first is not None and len(answers) >= 4:   # below the first call's threshold digit
            h = first - h if first >= 0 else -1
        hint = np.array([h], np.int64)
        got = victim_slots(tkeys, tstate, tscore, protect, n, scored, hint)
        assert got.dtype == np.int64
        answers.append(np.sort(got).tolist())
        first = hint[0] if first is None else first
    assert all(a == answers[0] for a in answers), (n, answers)
    return answers[0]


@pytest.mark.parametrize("seed", range(3))
def test_victims_equal_a_full_sort_on_adversarial_tables(seed):
    """``victim_slots`` (a radix select over the scores, then the keys of the threshold score) picks
    exactly the slots the full (score, key) sort puts first: equal scores, keys that differ only in
    their low bits, scores past what one histogram pass separates, tombstones and protected keys, and
    n = 0, 1, m - 1, m (every eligible slot) and past m; whatever its hint (``_victims``)."""
    for name, tkeys, tstate, tscore, protect in _adversarial(seed):
        m = _victims_by_full_sort(tkeys, tstate, tscore, protect, tkeys.shape[0]).shape[0]
        for n in sorted({0, 1, 2, 17, m // 3, max(m - 1, 0), m, m + 5}):
            want = _victims_by_full_sort(tkeys, tstate, tscore, protect, n)
            assert _victims(tkeys, tstate, tscore, protect, n) == np.sort(want).tolist(), (name, n)


@pytest.mark.parametrize("seed", range(6))
def test_victims_are_the_smallest_score_then_key_selected_without_sorting_the_table(seed):
    """``victim_slots`` picks exactly the eligible slots a full (score, key) sort would put first, with
    many ties of score (few counts and batches), none, a protected batch, n at and past the eligible
    count; and, on a table whose live slots all score and whose other slots score 0 (the invariant of
    ``_cache_kernels_cpu``), the same with ``scored`` True (the scores alone read)."""
    rng = np.random.default_rng(seed)
    S = 1 << 12
    spread = (2, 3) if seed % 2 else (1000, 1 << 20)            # heavy ties of score, or almost none
    tkeys, tstate, tscore = _table(rng, S, 3000, rng.choice(np.uint64(1) << np.uint64(62), 3000, replace=False),
                                   rng.integers(1, spread[0], S), rng.integers(0, min(spread[1], 9), S))
    protect = 7
    m = _victims_by_full_sort(tkeys, tstate, tscore, protect, S).shape[0]
    for n in (0, 1, 17, m // 2, m - 1, m, m + 5):
        want = sorted(_victims_by_full_sort(tkeys, tstate, tscore, protect, n).tolist())
        assert _victims(tkeys, tstate, tscore, protect, n) == want, n
    live = (tkeys != np.uint64(0xFFFFFFFFFFFFFFFF)) & (tstate == 0)
    tscore[~live] = 0
    for n in (0, 1, 17, m // 2, m - 1, m, m + 5):
        want = sorted(_victims_by_full_sort(tkeys, tstate, tscore, protect, n).tolist())
        assert _victims(tkeys, tstate, tscore, protect, n, scored=True) == want, n


def test_a_key_inserted_and_never_looked_up_is_a_victim_until_it_is_used():
    """Keys inserted without a lookup score 0 (the table reads keys and states to find them, as the
    ``unscored`` flag says); once every live key is used, the scores alone decide, as before."""
    t = HashTable(64, 1)
    used = np.arange(1, 9, dtype=np.uint64)
    t.insert(used, np.ones((8, 1)))
    t.lookup(used, 1)
    t.insert(np.array([20, 21], np.uint64), np.ones((2, 1)))   # never looked up: score 0
    assert t.evict(3, protect_from=5)[0].tolist() == [1, 20, 21]
    t.lookup(used[1:], 2)
    assert t.evict(2, protect_from=5)[0].tolist() == [2, 3]
    assert not t._impl.unscored   # settled by that eviction: every live key scores
    t.insert(np.array([30], np.uint64), np.ones((1, 1)))
    t.erase(np.array([8], np.uint64))
    t.purge()   # the in-place re-lay keeps the flag: key 30 still scores 0
    assert t._impl.unscored and t.evict(1, protect_from=5)[0].tolist() == [30]


def test_victims_when_the_gathered_slots_overflow_or_miss_the_threshold():
    """A threshold digit holding more eligible slots than the first pass gathers (4 n + 65536): the
    second pass finds them, under any hint; then a hint below the threshold, and one at it."""
    rng = np.random.default_rng(7)
    S, n_live = 1 << 18, 150_000
    keys = rng.choice(np.uint64(1) << np.uint64(62), n_live, replace=False).astype(np.uint64)
    tkeys, tstate, tscore = _table(rng, S, n_live, keys, 1, rng.integers(4, 6, S))
    tstate[:] = 0
    tscore[tkeys == np.uint64(0xFFFFFFFFFFFFFFFF)] = 0
    for n in (10, 70_000, n_live - 3):
        want = sorted(_victims_by_full_sort(tkeys, tstate, tscore, 9, n).tolist())
        for scored in (False, True):
            assert _victims(tkeys, tstate, tscore, 9, n, scored) == want, (n, scored)


def test_scores_survive_growth_and_purge_and_reset_when_a_key_leaves():
    t = HashTable(4, 1)
    t.insert(np.array([1, 2, 3], np.uint64), np.ones((3, 1)))
    t.lookup(np.array([1], np.uint64), 5)
    t.erase(np.array([3], np.uint64))
    t.purge()
    t.reserve(64)  # entries re-laid twice: the scores go with them
    t.insert(np.array([3], np.uint64), np.ones((1, 1)))  # back, unused
    assert t.evict(2, protect_from=6)[0].tolist() == [2, 3]


def test_lookup_answers_slots_and_refuses_bad_batches():
    t = HashTable(16, 2)
    t.insert(np.array([7, 8], np.uint64), np.ones((2, 2)))
    slots = t.lookup(np.array([8, 9, 7], np.uint64), 0)
    assert slots.dtype == np.int64 and (slots >= 0).tolist() == [True, False, True]
    with pytest.raises(InvalidInputError, match="batch"):
        t.lookup(np.array([7], np.uint64), -1)
    with pytest.raises(InvalidInputError, match="protect_from"):
        t.evict(1, 2**32)
    assert t.evict(0, 1)[0].shape == (0,)


@pytest.mark.parametrize("seed", range(6))
def test_insert_new_is_an_insert_and_a_lookup_with_the_rows_written_in_place(seed):
    """``insert_new`` (the CPU twin's fetch: each row written into the slot its key claims) leaves the
    table as ``insert`` then ``lookup`` do: the same rows and scores, so the same victims later."""
    rng = np.random.default_rng(seed)
    a, b = HashTable(8, 3, max_load_factor=0.75), HashTable(8, 3, max_load_factor=0.75)
    for batch in range(14):
        keys = np.unique(rng.integers(1, 80, rng.integers(1, 20)).astype(np.uint64))
        rng.shuffle(keys)
        new = keys[np.asarray(a.lookup(keys, batch)) < 0]              # the batch's use of the live keys
        np.testing.assert_array_equal(new, keys[np.asarray(b.lookup(keys, batch)) < 0])
        rows = rng.normal(size=(new.shape[0], 3)).astype(np.float32)
        for t in (a, b):
            t.reserve(len(t) + new.shape[0])

        def fill(out, at):
            out[at] = rows
        a.insert_new(new, fill, batch)
        b.insert(new, rows)
        b.lookup(new, batch)
        n, protect = int(rng.integers(0, 8)), max(0, batch - int(rng.integers(0, 3)))
        assert_same([("evict", *a.evict(n, protect))], [("evict", *b.evict(n, protect))])
    assert_same(replay(a, []), replay(b, []))


def test_insert_new_refuses_live_or_repeated_keys_and_a_failing_fill_changes_nothing():
    t = HashTable(16, 2)
    t.insert(np.array([1, 2], np.uint64), np.ones((2, 2)))

    def fill(out, at):
        out[at] = 7
    for keys in ([3, 1], [4, 4]):                   # 1 is live; 4 is repeated
        with pytest.raises(InvalidInputError, match="live or repeated"):
            t.insert_new(np.array(keys, np.uint64), fill, 0)

    def fails(out, at):
        out[at] = 7
        raise OSError("injected read failure")
    with pytest.raises(OSError, match="injected"):
        t.insert_new(np.array([5, 6], np.uint64), fails, 0)
    assert len(t) == 2 and not t.contains(np.array([3, 4, 5, 6], np.uint64)).any()
    k, r = t.export()
    assert sorted(k.tolist()) == [1, 2] and (r == 1).all()
    t.accumulate(np.array([5, 6, 3], np.uint64), np.ones((3, 2)))  # slots given back hold zeros
    assert (t.get(np.array([5, 6, 3], np.uint64))[0] == 1).all()
    t.lookup(np.array([1, 2, 3], np.uint64), 0)                   # one use each; 5 and 6 none:
    assert t.evict(2, 1)[0].tolist() == [5, 6]                    # the failed fill counted none


@pytest.mark.parametrize("seed", range(5))
def test_unique_inverse_on_the_array_module_is_the_hosts_first_occurrence_order(seed):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 50, 400).astype(np.uint64) * np.uint64(2**40 + 7)
    u, inv = unique_inverse(keys, np)
    hu, _, hinv = unique_counts(keys)
    np.testing.assert_array_equal(u, hu)
    np.testing.assert_array_equal(inv, hinv)
    np.testing.assert_array_equal(u[inv], keys)
    e, ei = unique_inverse(np.empty(0, np.uint64), np)
    assert e.shape == ei.shape == (0,)
    np.testing.assert_array_equal(unique_keys(keys, np), hu)  # the working set: no inverse needed
    assert unique_keys(np.empty(0, np.uint64), np).shape == (0,)


def test_missing_keys_are_the_keys_not_resident_in_input_order():
    t = HashTable(32, 1)
    t.insert(np.array([5, 9], np.uint64), np.ones((2, 1)))
    ukeys = np.array([9, 4, 5, 1], np.uint64)
    slots, misses = missing_keys(t, ukeys, 3, np)
    assert misses.tolist() == [4, 1] and (slots >= 0).tolist() == [True, False, True, False]
    assert t.evict(5, protect_from=3)[0].shape == (0,)  # 5 and 9 were used in batch 3: protected



def test_missing_is_the_keys_not_live_in_input_order_and_counts_the_live_ones():
    """``HashTable.missing`` (its misses compacted by ``missing_keys``, branch-free): every key not live,
    in input order, from a contiguous, strided or empty input; each live key counts its use."""
    rng = np.random.default_rng(5)
    t = HashTable(4096, 2)
    keys = rng.permutation(np.arange(1, 3001, dtype=np.uint64))
    live = keys[rng.random(keys.shape[0]) < 0.5]
    t.insert(live, np.zeros((live.shape[0], 2), np.float32))
    expect = keys[~np.isin(keys, live)]
    np.testing.assert_array_equal(t.missing(keys, 0), expect)
    np.testing.assert_array_equal(t.missing(keys[::3], 1), keys[::3][~np.isin(keys[::3], live)])
    assert t.missing(np.empty(0, np.uint64), 2).shape == (0,)
    np.testing.assert_array_equal(t.evict(live.shape[0], protect_from=1)[0], np.sort(live[~np.isin(live, keys[::3])]))

def test_evict_into_hands_the_victims_rows_over_in_place_and_erases_them_after():
    """``evict_into`` chooses the victims ``evict`` chooses and hands their rows to the sink where they
    lie (the slot array and the victims' slots, key order); a sink that raises leaves the table as it was."""
    from hps import HashTable

    rng = np.random.default_rng(2)
    tables = [HashTable(512, 3) for _ in range(2)]
    keys = np.unique(rng.integers(1, 10_000, 300).astype(np.uint64))
    for t in tables:
        t.insert(keys, np.arange(keys.shape[0] * 3, dtype=np.float32).reshape(-1, 3))
        for b in range(4):
            t.lookup(keys[b::5], b)
    got = {}

    def sink(k, rows, at):
        got.update(keys=k.copy(), rows=rows[at].copy())

    def failing(k, rows, at):
        raise OSError("injected")

    with pytest.raises(OSError):
        tables[1].evict_into(70, 2, failing)
    assert len(tables[1]) == keys.shape[0]
    np.testing.assert_array_equal(np.sort(tables[1].export()[0]), keys)
    k0, r0 = tables[0].evict(70, 2)
    k1 = tables[1].evict_into(70, 2, sink)
    assert k0.shape[0] == 70
    np.testing.assert_array_equal(k0, k1)
    np.testing.assert_array_equal(got["keys"], k0)
    np.testing.assert_array_equal(got["rows"], r0)
    assert len(tables[0]) == len(tables[1]) == keys.shape[0] - 70
    e0, e1 = tables[0].export(), tables[1].export()
    np.testing.assert_array_equal(np.sort(e0[0]), np.sort(e1[0]))
