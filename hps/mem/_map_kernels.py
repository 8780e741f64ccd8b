"""Kernels of the MEM-PS row cache's keys (``hps.mem.RowCache``): the key -> slot map and the ghost
table's cells, the kernels that only find rows through the map (they change no policy state), and
the kernels of ``unique_counts``, ``unique_keys`` and ``unique_segments`` (hosts in ``_unique``).
Kernels and device functions only; the policy's state and the operations that change it are in
``_policy_kernels`` and ``_cache_kernels``.

- Key -> slot map: linear probing ``mkeys`` (M,) uint64 / ``mvals`` (M,) int32, M a power of two
  >= 2 C (C = the cache's slots), ``EMPTY`` = all ones; deletion by backward shift (no tombstones).
  Only ``_map_put`` and ``_map_del`` write it (``_slots_kernels.rebuild_map`` through ``_map_put``).
- Ghost history (optional; G = ``ghost.shape[0]`` is 0 or a power of two): a direct-mapped table
  ``ghost`` (G, 2) uint64 of (evicted key's tag, its frequency) -- one cache line per probe -- cell
  ``mix64(key ^ 0x2545F4914F6CDD1D) & (G - 1)`` (``_ghost_cell``: a salt of its own, written as a
  literal since kernels read no module globals). The tag is the key's complement (``_ghost_tag``), so
  an empty cell (tag 0: the all-ones key is never a key) is all zeros, as fresh memory reads: a grown
  table is empty without a write (``_slots``, ``_reserve``).

keys (n,) uint64; ``rows`` (C, W); every ``found``/``out`` argument has n entries and is written.
Kernels do no bounds checks and are not thread-safe: the host sizes every array and serialises
calls on one state.
"""

from __future__ import annotations

import numpy as np

from .._hashing import mix64
from .._jit import njit
from .._prefetch import home_ahead, prefetch_home, ring_next, ring_start

# ---------------------------------------------------------------- key -> int32 map (linear probing)

@njit(nogil=True, cache=True, inline="always")
def _map_get(mkeys, mvals, key):
    return _map_get_from(mkeys, mvals, key, mix64(key) & np.uint64(mkeys.shape[0] - 1))


@njit(nogil=True, cache=True, inline="always")
def _map_get_from(mkeys, mvals, key, i):
    """:func:`_map_get` from ``key``'s home cell ``i`` (``mix64(key) & (M - 1)``, computed by the caller)."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    mask = np.uint64(mkeys.shape[0] - 1)
    while True:
        k = mkeys[i]
        if k == key:
            return np.int64(mvals[i])
        if k == empty:
            return np.int64(-1)
        i = (i + np.uint64(1)) & mask


@njit(nogil=True, cache=True, inline="always")
def _map_put(mkeys, mvals, key, val):
    """REQUIRES: key absent, map not full."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    mask = np.uint64(mkeys.shape[0] - 1)
    i = mix64(key) & mask
    while mkeys[i] != empty:
        i = (i + np.uint64(1)) & mask
    mkeys[i] = key
    mvals[i] = val


@njit(nogil=True, cache=True, inline="always")
def _map_del(mkeys, mvals, key):
    """Remove ``key`` (no-op when absent) by backward-shift deletion."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    mask = np.uint64(mkeys.shape[0] - 1)
    i = mix64(key) & mask
    while True:
        k = mkeys[i]
        if k == key:
            break
        if k == empty:
            return
        i = (i + np.uint64(1)) & mask
    j = i
    while True:
        j = (j + np.uint64(1)) & mask
        k = mkeys[j]
        if k == empty:
            break
        h = mix64(k) & mask
        # The entry at j may move back to i unless its home h lies cyclically in (i, j].
        if i <= j:
            stays = i < h <= j
        else:
            stays = h > i or h <= j
        if not stays:
            mkeys[i] = k
            mvals[i] = mvals[j]
            i = j
    mkeys[i] = empty


@njit(nogil=True, cache=True, inline="always")
def _ghost_tag(key):
    """What a ghost cell holds for ``key`` (its complement; 0: the cell is empty)."""
    return key ^ np.uint64(0xFFFFFFFFFFFFFFFF)


@njit(nogil=True, cache=True, inline="always")
def _ghost_cell(ghost, key):
    """Ghost cell of ``key``: an independent hash (salt 0x2545F4914F6CDD1D) of a power-of-two table."""
    return mix64(key ^ np.uint64(0x2545F4914F6CDD1D)) & np.uint64(ghost.shape[0] - 1)


@njit(nogil=True, cache=True, inline="always")
def _prefetch_map(mkeys, mvals, keys):
    """Prefetch the home map cell (key and value) of every key (see ``hps/_prefetch.py``)."""
    for i in range(keys.shape[0]):
        prefetch_home(mkeys, keys[i])
        prefetch_home(mvals, keys[i])


# ---------------------------------------------------------------- kernels that only read through the map

@njit(nogil=True, cache=True, _nrt=False)
def find(mkeys, mvals, keys, ring, slots):
    """slots[i] = the cache slot of ``keys[i]``, -1 where it is not cached; no access is counted.
    keys (n,) uint64, slots (n,) int64 (written), ``ring`` (R,) uint64 scratch (R = ``prefetch_ahead()``):
    each key's home map cell is hashed once and prefetched, with its value, R keys ahead
    (``hps._prefetch.home_ahead``), not in a pass over the whole batch first (whose first cells a
    large batch evicts again before their probes)."""
    ring_start(mkeys, mvals, keys, ring)
    for i in range(keys.shape[0]):
        slots[i] = _map_get_from(mkeys, mvals, keys[i], ring_next(mkeys, mvals, keys, i, ring))


@njit(nogil=True, cache=True, _nrt=False)
def gather(rows, mkeys, mvals, keys, out_rows, found):
    """Copy rows of cached keys without counting an access. found (n,) bool written."""
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        found[i] = s >= 0
        if s >= 0:
            for j in range(rows.shape[1]):
                out_rows[i, j] = rows[s, j]


@njit(nogil=True, cache=True, _nrt=False)
def pin_counts(pins, mkeys, mvals, keys, out):
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        out[i] = pins[s] if s >= 0 else 0


@njit(nogil=True, cache=True, _nrt=False)
def update(rows, dirty, mkeys, mvals, keys, in_rows, in_at, found):
    """Assign rows of cached keys and mark them dirty; no access is counted. found (n,) bool written.
    The row of ``keys[i]`` is ``in_rows[in_at[i]]`` (``in_at`` (n,) int64 in bounds; empty: ``in_rows[i]``).
    Returns the number of keys found."""
    n = 0
    pick = in_at.shape[0] > 0
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        found[i] = s >= 0
        if s < 0:
            continue
        n += 1
        dirty[s] = True
        r = in_at[i] if pick else i
        for j in range(rows.shape[1]):
            rows[s, j] = in_rows[r, j]
    return n


@njit(nogil=True, cache=True, _nrt=False)
def mark_clean(dirty, mkeys, mvals, keys):
    for i in range(keys.shape[0]):
        s = _map_get(mkeys, mvals, keys[i])
        if s >= 0:
            dirty[s] = False


@njit(nogil=True, cache=True, inline="always")
def _find_or_add(tab, uniq, u, key, h):
    """Linear probing of ``tab`` (m,) int32/int64, -1 = free, m a power of two, each cell an index
    into ``uniq``, from ``key``'s home cell ``h`` (``mix64(key) & (m - 1)``, computed by the caller):
    every key, all ones included, is a key (no sentinel). -> (index of ``key`` in ``uniq``, its
    cell); a new key becomes ``uniq[u]`` (index u: the caller counts it)."""
    mask = np.uint64(tab.shape[0] - 1)
    while True:
        v = np.int64(tab[h])
        if v < 0:
            tab[h] = u
            uniq[u] = key
            return np.int64(u), h
        if uniq[v] == key:
            return v, h
        h = (h + np.uint64(1)) & mask


@njit(nogil=True, cache=True, _nrt=False)
def _unique_counts(keys, tab, uniq, counts, inverse, ring):
    """The kernel of :func:`unique_counts` (and, with ``counts``/``inverse`` of length 0, of
    :func:`unique_keys`): :func:`_find_or_add` over ``tab`` (m,) -1 filled, m a power of two >= 2 n.
    A cell is 4 bytes, not a (key, value) pair: the table of a batch's union (~0.7 M keys: 8 MiB) and
    ``uniq`` stay in the last-level cache together, and the home cells of the keys R ahead are
    computed and prefetched (``hps._prefetch.home_ahead``; ``ring`` (R,) uint64 scratch, R = ``prefetch_ahead()``),
    so the probes' misses overlap. ``counts`` (n,) zeroed. -> the number of distinct keys u
    (``uniq[:u]``, ``counts[:u]`` written; ``inverse`` (n,))."""
    n = keys.shape[0]
    ahead = ring.shape[0]
    full = inverse.shape[0] == n
    for i in range(min(ahead, n)):
        home_ahead(tab, keys, i, ring)
    u = 0
    for i in range(n):
        h = ring[i & (ahead - 1)]
        if i + ahead < n:
            home_ahead(tab, keys, i + ahead, ring)
        v, _ = _find_or_add(tab, uniq, u, keys[i], h)
        if v == u:
            u += 1
        if full:
            counts[v] += 1
            inverse[i] = v
    return u


@njit(nogil=True, cache=True, _nrt=False)
def _unique_segments(keys, bounds, tab, cells, uniq, ubounds, inverse, ring):
    """The kernel of :func:`unique_segments`: :func:`_find_or_add` per segment over one table ``tab``
    (m,) (-1 filled, m a power of two >= 2 x the longest segment; home cells computed R keys ahead as
    in ``_unique_counts``, ``ring`` (R,)); after each segment only the cells it filled (``cells``,
    scratch of the longest segment's length) go back to -1, so the table stays in cache and is never
    cleared whole."""
    ahead = ring.shape[0]
    base = bounds[0]
    u = 0
    ubounds[0] = 0
    for s in range(bounds.shape[0] - 1):
        a, b = bounds[s], bounds[s + 1]
        first = u
        for i in range(a, min(a + ahead, b)):
            home_ahead(tab, keys, i, ring)
        for i in range(a, b):
            h = ring[i & (ahead - 1)]
            if i + ahead < b:
                home_ahead(tab, keys, i + ahead, ring)
            v, h = _find_or_add(tab, uniq, u, keys[i], h)
            if v == u:
                cells[u - first] = h
                u += 1
            inverse[i - base] = v - first
        for c in range(u - first):
            tab[cells[c]] = -1
        ubounds[s + 1] = u
    return u
