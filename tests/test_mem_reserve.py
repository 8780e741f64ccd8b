"""``hps.mem._reserve.Reserved`` (arrays growing inside reserved address space) against a model of
``ndarray.resize``, and a ``RowCache`` growing over many pages of it against a dict."""

from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.mem import RowCache
from hps.mem import _cache
from hps.mem._reserve import Reserved


@settings(max_examples=120, deadline=None)
@given(tail=st.sampled_from([(), (3,), (64,)]), limit=st.integers(0, 300),
       ops=st.lists(st.tuples(st.integers(0, 400), st.integers(0, 500)), min_size=1, max_size=12))
def test_views_behave_as_resize_across_growth_shrinks_and_new_reservations(tail, limit, ops):
    """Each view holds what ``ndarray.resize`` would: the elements kept, zeros past the previous end (the
    bytes a shrink left before a page edge and the pages it gave back included), across views past the
    reservation (a new one, the elements in use copied)."""
    r = Reserved(limit, np.float32, tail)
    model = np.zeros((0, *tail), np.float32)
    for step, (n, lim) in enumerate(ops):
        a = r.view(n, lim)
        model = np.resize(model, (n, *tail)) if n <= model.shape[0] else \
            np.concatenate([model, np.zeros((n - model.shape[0], *tail), np.float32)])
        np.testing.assert_array_equal(a, model)
        assert a.flags.c_contiguous and a.flags.writeable and r.limit >= n
        a[...] = np.arange(a.size, dtype=np.float32).reshape(a.shape) + step + 1   # every element written
        model = a.copy()


def test_a_shrink_gives_pages_back_and_they_read_as_zeros():
    r = Reserved(1 << 16, np.float32, (64,))   # 16 MiB reserved
    a = r.view(1 << 16)
    a[...] = 7
    r.view(100)
    b = r.view(1 << 16)
    assert (b[:100] == 7).all() and (b[100:] == 0).all()


def test_a_cache_growing_over_many_pages_keeps_every_row():
    """A RowCache of 256 B rows starting at one slot and doubling to 8192 slots (2 MiB of rows), shrunk
    and grown again, holds exactly the rows put and not evicted, as a dict does."""
    rng = np.random.default_rng(5)
    with mock.patch.object(_cache, "INITIAL_SLOTS", 1):
        c = RowCache(8192, 64, ghost_factor=2.0)
    model = {}
    for step in range(30):
        keys = np.unique(rng.integers(0, 20_000, 700).astype(np.uint64))
        rows = rng.standard_normal((keys.shape[0], 64)).astype(np.float32)
        ev = c.put(keys, rows)
        model.update(zip(keys.tolist(), rows))
        back = c.contains(ev.keys)   # evicted before its own turn in the batch, then put again
        for k in ev.keys[~back].tolist():
            model.pop(k)
        if step in (12, 20):
            for k in c.evict_to(1000).keys.tolist():
                model.pop(k)
            c.set_capacity(1000 if step == 12 else 3000)
        if step == 16:
            c.set_capacity(8192)
    assert len(c) == len(model) and c._s.n > 1000
    k = np.fromiter(model, np.uint64)
    got, found = c.peek(k)
    assert found.all()
    np.testing.assert_array_equal(got, np.stack([model[x] for x in k.tolist()]))
