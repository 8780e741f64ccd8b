"""The HBM-PS as a cache across batches: a score beside every slot, and victims chosen on the table's
device (seed 004, Section 4.2 and Appendix D: the MEM-PS keeps recently used parameters in an LRU
stage and the others in an LFU stage; here the same two ideas rank the rows of the HBM-PS).

Policy, the same on both backends (``_cache_kernels_cpu.py`` / ``_cache_kernels_cuda.py``):

- Each slot carries ``score = (count << 32) | last``: ``count`` the batches that looked the key up
  (saturating at 2**32 - 1), ``last`` the latest of them. :meth:`CacheOps.lookup` (the batch's find:
  its unique keys, once per batch) counts one use for every live key it finds, with atomics on the GPU,
  so the score does not depend on the order threads run in. A key inserted, revived or re-laid keeps
  the score it has (0 when new); an erased or evicted key's score is reset.
- :meth:`CacheOps.evict` frees up to ``n`` slots: keys looked up in batch ``protect_from`` or later
  (the batches in flight: the LRU stage) are never chosen; among the others the least frequently used
  go first (the LFU stage), then the least recently used, then the smaller key, i.e. ascending
  ``(score, key)``, a total order, so the choice does not depend on the slot layout and the CPU and
  the GPU choose the same keys. The victims' keys and rows come back in key order in one blocking
  call (one copy of each array on the GPU, sorted there when CuPy is installed), and are erased.
  Dirtiness is not tracked: every victim's row comes back.

On the CPU a radix select too: one streaming pass histograms the eligible slots by a first digit of
the score (its count and last batch, 16 bits), the slots below the digit that holds the ``n``-th
smallest are victims and that digit's are split by narrower passes, by score, then key; no sort. The
first pass gathers the slots up to a little past the last eviction's threshold digit (it moves little
from one eviction to the next), so a second streaming pass is needed only when the threshold moved
past them; where every live slot has been looked up (the HBM-PS twin) the passes read the scores alone.
On the GPU the choice is made on the device: the eligible slots are compacted, a radix select over the
128-bit ``(score, key)`` finds the ``n``-th smallest in 16 passes of 8-bit digits (a histogram per
pass, reduced on one thread; nothing crosses to the host but the number of eligible slots), and the
slots at or below it are compacted.
"""

from __future__ import annotations

import numpy as np

from .. import _launch as L
from ..errors import InternalError, InvalidInputError
from ._cache_kernels_cpu import missing_keys

#: Batch indices a score holds (its low 32 bits).
BATCH_LIMIT = 2**32 - 1


def _batch(b, name: str) -> int:
    if int(b) != b or not 0 <= b < BATCH_LIMIT:
        raise InvalidInputError(f"{name} must be a batch index in [0, {BATCH_LIMIT}), got {b!r}")
    return int(b)


class CacheOps:
    """The cache operations of :class:`hps.HashTable` (a mixin: the table's lock, backend and counts)."""

    def lookup(self, keys, batch: int, stream=None):
        """Slots (n,) int64 of ``keys`` (n,) uint64, -1 where a key is not live (the miss list is
        ``keys[slots < 0]``); each live key's score counts a use in ``batch``. Pass a batch's unique keys
        (a key repeated in one call counts each time). A device array when the keys were on the device,
        else a host array. Blocking."""
        with self._lock, self._impl.scope():
            self._settle()
            k, on_dev = self._impl.keys_in(keys, stream=stream)
            slots = self._impl.empty("slots", (k.shape[0],), np.int64, on_dev)
            self._impl.lookup_async(k, _batch(batch, "batch"), slots, stream)
            self._impl.sync(stream)
            return self._impl.out(slots, on_dev, stream)

    def missing(self, keys, batch: int):
        """The keys of host ``keys`` (n,) uint64 that are not live, in input order (host array), each
        live key counting a use in ``batch`` (:meth:`lookup`: pass a batch's unique keys). Blocking."""
        k = np.ascontiguousarray(keys, np.uint64)
        slots = np.ascontiguousarray(self.lookup(k, batch), np.int64)
        out = np.empty(k.shape[0], np.uint64)
        return out[:missing_keys(k, slots, out)]

    def lookup_async(self, keys, batch: int, slots, stream=0) -> None:
        """:meth:`lookup` into ``slots`` (n,) int64, device arrays; enqueued on ``stream``."""
        with self._lock:
            k, _ = self._impl.keys_in(keys, stream=stream, blocking=False)
            out = self._impl.device_out(slots)
            if tuple(out.shape) != (k.shape[0],) or out.dtype != np.int64:
                raise InvalidInputError(f"slots must be ({k.shape[0]},) int64, got {tuple(out.shape)} {out.dtype}")
            self._impl.lookup_async(k, _batch(batch, "batch"), out, stream)

    def insert_new(self, keys, fill, batch: int) -> None:
        """Insert distinct host ``keys`` (n,) uint64, none of them live, whose rows ``fill(out, at)``
        writes (``out[at[i]]`` = the row of ``keys[i]``; ``out`` (m, dim) host of the table dtype, ``at``
        (n,) int64), each key counting its first use in ``batch`` (as :meth:`lookup` would after an
        insert). On the CPU ``out`` is the slot array itself and ``at`` the slots the keys claimed: the
        rows are written in place, nothing is copied or allocated for them; ``fill`` runs holding the
        table's lock but not its row lock, the claimed slots hidden (``_rows.py``: ``find_rows`` and
        ``write_rows`` of other keys go on meanwhile, and answer these absent); a ``fill`` that raises
        leaves the table as it was. On the GPU ``out`` is a new host (n, dim) array, then
        :meth:`insert` and :meth:`lookup`. Raises HashTableFullError (nothing changed) when they do not
        fit, InvalidInputError when one of them is live or repeated. Blocking."""
        b = _batch(batch, "batch")
        with self._lock:
            self._settle()
            k, _ = self._impl.keys_in(keys)
            n = k.shape[0]
            if n == 0:
                return
            if self.device != "cpu":  # through a host array
                rows = np.empty((n, self._dim), self._dtype)
                fill(rows, np.arange(n, dtype=np.int64))
                self.insert(k, rows)
                self.lookup(k, b)
                return
            with self._rows:
                ticket = self._claim(k)
                if ticket[2] != n:
                    self._rollback(ticket)
                    raise InvalidInputError(f"insert_new: {n - ticket[2]} of the {n} keys are live or "
                                            "repeated")
                self._impl.hide(ticket[0])   # absent to the row path until their rows are in
            try:
                self._impl.fill_claimed(ticket[0], fill, b)   # without _rows: the row path goes on
            except BaseException:
                with self._rows:
                    self._impl.unhide(ticket[0])
                    self._rollback(ticket)
                raise
            with self._rows:
                self._impl.unhide(ticket[0])
            self._size += n
            self._tombstones -= ticket[3]

    def evict(self, n: int, protect_from: int, stream=None):
        """Erase up to ``n`` victims (see the module docstring) and return their (keys (k,) uint64, rows
        (k, dim)) host arrays in key order, k = min(n, live keys not looked up since batch
        ``protect_from``). Blocking."""
        protect = _evict_args(n, protect_from)
        with self._lock, self._impl.scope():
            self._settle()
            if n == 0 or self._size == 0:
                return np.empty(0, np.uint64), np.empty((0, self._dim), self._dtype)
            with self._rows:
                keys, rows = self._impl.evict(int(n), protect, self._size, stream)
            self._size -= keys.shape[0]
            self._tombstones += keys.shape[0]
            return keys, rows

    def evict_into(self, n: int, protect_from: int, sink):
        """:meth:`evict`, the victims' rows handed to ``sink(keys, rows, at)`` (the row of ``keys[i]`` is
        ``rows[at[i]]``; ``at`` None: ``rows[i]``) before they are erased -> their keys (k,) uint64, in
        key order. On the CPU ``rows`` is the slot array itself and ``at`` the victims' slots: nothing is
        gathered or allocated for the rows, and a ``sink`` that raises leaves the table as it was (on the
        GPU the rows come to the host first, as with :meth:`evict`, and are erased already). Blocking;
        ``sink`` runs holding the table's lock (no other call changes the table meanwhile; the sink may
        read it) but, on the CPU, not its row lock: the victims are hidden first (``_rows.py``), so
        ``find_rows`` and ``write_rows`` of other keys go on while it runs and answer the victims absent;
        a victim's ``write_rows`` then goes through ``insert``, after the eviction."""
        if self.device != "cpu":
            keys, rows = self.evict(n, protect_from)
            return _evicted_to(sink, keys, rows)
        protect = _evict_args(n, protect_from)
        with self._lock:
            self._settle()
            if n == 0 or self._size == 0:
                return _evicted_to(sink, np.empty(0, np.uint64), np.empty((0, self._dim), self._dtype))
            keys, slots = self._impl.victims(int(n), protect)   # reads what only _lock's holder changes
            with self._rows:
                self._impl.hide(slots)   # absent to the row path, their rows untouched by it
            try:
                sink(keys, self._impl.tvals, slots)   # without _rows: the row path goes on
            except BaseException:
                with self._rows:
                    self._impl.unhide(slots)
                raise
            self._impl.erase_victims(slots, hidden=True)
            self._size -= keys.shape[0]
            self._tombstones += keys.shape[0]
            return keys


def _evict_args(n, protect_from) -> int:
    """Check ``evict``'s arguments -> the batch ``protect_from``."""
    if int(n) != n or n < 0:
        raise InvalidInputError(f"n must be a non-negative integer, got {n!r}")
    return _batch(protect_from, "protect_from")


def _evicted_to(sink, keys, rows, at=None):
    """``sink(keys, rows, at)`` -> ``keys``."""
    sink(keys, rows, at)
    return keys


def in_key_order(keys, rows):
    """(keys, rows) host arrays, keys (k,) uint64 distinct, rows (k, dim): both in ascending key order
    (distinct keys have one order, whatever the sort; the rows are gathered whole, ``np.take``)."""
    o = np.argsort(keys)
    return keys[o], np.take(rows, o, axis=0)


def victim_slots(impl, n: int, protect: int, n_live: int, s):
    """Device slots (k,) int64 of the k = min(n, eligible) victims of a CUDA table ``impl`` (its
    ``tkeys``, ``tstate``, ``tscore``), in no particular order; ``n_live`` its live keys. Enqueued on
    ``s``; reads back the number of eligible slots (8 bytes)."""
    from . import _cache_kernels_cuda as C

    alloc = impl.alloc
    c_score, c_key, c_slot = impl.entries(n_live, protect, s)
    m = int(impl._read(impl.counts, s)[0])
    if m <= n:
        return c_slot[:m]
    prefix = alloc.to_device(np.zeros(2, np.uint64), s)
    rank = alloc.to_device(np.array([n], np.int64), s)
    hist = alloc.to_device(np.zeros(C.N_BINS, np.int64), s)
    for pas in range(C.N_PASSES):
        L.launch(C.radix_hist, L.grid1(m), s, c_score, c_key, np.int64(m), prefix, np.int64(pas), hist)
        L.launch(C.radix_pick, (1, 1), s, hist, prefix, rank, np.int64(pas))
    out = alloc.empty(n, np.int64)
    impl._zero(impl.counts, s)
    L.launch(C.select_upto, L.grid1(m), s, c_score, c_key, c_slot, np.int64(m), prefix, out, impl.counts)
    got = int(impl._read(impl.counts, s)[0])
    if got != n:
        raise InternalError(f"the radix select chose {got} victims instead of {n} (a bug)")
    return out
