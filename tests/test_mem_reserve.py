"""``hps.mem._reserve.Reserved`` (arrays growing inside reserved address space) against a model of
``ndarray.resize``, and a ``RowCache`` growing over many pages of it against a dict."""

from unittest import mock

import numpy as np
import pytest
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


def test_a_reservation_the_system_refuses_falls_back_to_what_is_needed(monkeypatch):
    """Under strict overcommit (``vm.overcommit_memory=2`` ignores MAP_NORESERVE) a large reservation
    fails: ``Reserved`` then maps only the elements in use, and each view past them maps anew and copies
    them over, holding what ``resize`` would; a mapping of what is needed that fails too raises."""
    from hps.mem import _reserve

    real, sizes = _reserve.mmap.mmap, []
    cap = 4096 * 4   # bytes the fake system agrees to map at once: 256 rows of 16 float32

    def mmap_(fileno, length, **kw):
        sizes.append(length)
        if length > cap:
            raise OSError(12, "Cannot allocate memory")
        return real(fileno, length, **kw)

    monkeypatch.setattr(_reserve.mmap, "mmap", mmap_)
    r = Reserved(1 << 20, np.float32, (16,))   # 64 MiB asked: refused, one element mapped instead
    assert r.limit == 1 and sizes == [(1 << 20) * 64, 64]
    a = r.view(1)
    a[...] = 1
    b = r.view(40, limit=1 << 20)               # past the mapping: the limit refused again, 40 mapped
    assert r.limit == 40 and b.shape == (40, 16)
    assert (b[0] == 1).all() and (b[1:] == 0).all()
    b[...] = 3
    c = r.view(10)                               # a shrink inside the mapping maps nothing new
    assert r.limit == 40 and (c == 3).all() and len(sizes) == 4
    d = r.view(30)                               # regrown inside it: the released part reads as zeros
    assert (d[:10] == 3).all() and (d[10:] == 0).all()
    with pytest.raises(OSError):
        r.view(300)                              # more rows than the system maps at all
    # the failed call left the array as it was: its rows, and a later view that needs a new mapping makes one
    assert r.limit == 40 and r.n == 30 and (r.view(30)[:10] == 3).all()
    e = r.view(100)
    assert e.shape == (100, 16) and (e[:10] == 3).all() and (e[10:] == 0).all()
