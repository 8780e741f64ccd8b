"""CPU backend of :class:`hps.HashTable`: owns the slot arrays, launches ``_cpu_kernels``.

Not thread-safe on its own; :class:`hps.HashTable` serialises calls. Inputs are validated host
arrays (keys (n,) uint64 contiguous, rows (n, dim) of the table dtype).
"""

from __future__ import annotations

import contextlib

import numpy as np

from . import _cache_kernels_cpu as C
from . import _cpu_kernels as K
from .._keys import EMPTY_KEY, as_keys, check_rows
from .._prefetch import ahead_ring
from ..errors import InvalidInputError, InvalidTypeError


_NONE = np.empty(0, dtype=np.int64)        # ``get``'s slots when a call wants none
_NO_FOUND = np.empty(0, dtype=np.bool_)    # ``get``'s found when a call wants none


class CpuTableImpl:
    device = "cpu"
    #: Nothing to hold around a blocking call (the CUDA table looks its context up once there).
    scope = staticmethod(contextlib.nullcontext)

    def __init__(self, n_slots: int, dim: int, dtype, scores: bool = True):
        """``scores``: keep the cache score of every slot (``_cache.py``; 8 bytes a slot); an index
        that never evicts by score (``hps._index.KeyIndex``) goes without.

        Every slot array is written here (:meth:`clear`), as the CUDA table zeroes its arrays when it
        allocates them: ``np.zeros`` would map zero pages that the first inserts fault in at random
        slots, one fresh page (2 MiB with transparent huge pages) at a time, in the middle of a
        caller's batch. The first touch of fresh memory is what varies most from run to run (on a VM
        it may also fault the page in on the host: 0.2 to 10 s for 2 GiB, measured on the 2-core
        box): the HBM-PS twin of a training job takes it before the clock starts."""
        self.n_slots = n_slots
        self.dim = dim
        self.dtype = np.dtype(dtype)
        self.tkeys = np.empty(n_slots, dtype=np.uint64)
        self.tstate = np.empty(n_slots, dtype=np.int32)
        self.tvals = np.empty((n_slots, dim), dtype=self.dtype)
        self.tscore = np.empty(n_slots if scores else 0, dtype=np.uint64)  # cache scores (_cache.py)
        self.clear()  # tombstones = 0: lookups skip tstate while there are none; no key unscored
        self._pending = np.zeros(4, np.int64)
        self._hint = np.full(1, -1, np.int64)   # the last eviction's threshold digit (victim_slots)

    # -- input conversion (``stream`` is accepted for the CUDA twin's interface and ignored) --------
    def keys_in(self, keys, name="keys", stream=None, blocking=True):
        """(host keys, on_device=False). Device arrays are refused: the CPU table is host-only."""
        if hasattr(keys, "__cuda_array_interface__"):
            raise InvalidTypeError(f"{name} is a GPU array but this table lives on the CPU; "
                                   "pass a NumPy array or build the table with device='cuda'")
        return as_keys(keys, name), False

    def check_sentinel(self, keys, name="keys", stream=None) -> None:
        """Host keys were checked by ``keys_in``."""

    def rows_in(self, rows, n, name="values", stream=None, blocking=True):
        if hasattr(rows, "__cuda_array_interface__"):
            raise InvalidTypeError(f"{name} is a GPU array but this table lives on the CPU")
        return check_rows(rows, n, self.dim, self.dtype, name)

    def out(self, arr, on_device, stream=None):
        return arr

    def empty(self, name, shape, dtype, on_device=False):
        """A new host array for an output (``name``: the CUDA twin's scratch name)."""
        return np.empty(shape, dtype)

    def sync(self, stream=None) -> None:
        """Every CPU call has completed when it returns."""

    def device_out(self, a):
        """``a`` as an output array of an ``*_async`` call: a writable C-contiguous NumPy array."""
        if not isinstance(a, np.ndarray) or not (a.flags.c_contiguous and a.flags.writeable):
            raise InvalidTypeError(f"outputs of a CPU table are writable C-contiguous NumPy arrays, got "
                                   f"{type(a).__name__}")
        return a

    # -- operations (validated inputs) ------------------------------------------------------------
    def upsert(self, keys, rows, accumulate: bool, stream=None):
        """-> (n_new, n_revived)"""
        n_new, n_revived = K.upsert(self.tkeys, self.tstate, self.tvals, keys, rows, accumulate)
        self.tombstones -= int(n_revived)
        self.unscored |= n_new > 0   # new keys score 0 until a lookup
        return int(n_new), int(n_revived)

    def claim(self, keys, stream=None):
        slots = np.empty(keys.shape[0], dtype=np.int64)
        is_new = np.empty(keys.shape[0], dtype=np.int8)
        n_new, n_revived, n_failed = K.claim(self.tkeys, self.tstate, keys, slots, is_new, ahead_ring())
        self.tombstones -= int(n_revived)
        return slots, is_new, int(n_new), int(n_revived), int(n_failed)

    def rollback(self, slots, is_new, stream=None) -> None:
        K.rollback(self.tkeys, self.tstate, slots, is_new)
        self.tombstones += int((is_new == 2).sum())

    def write(self, slots, rows, accumulate: bool, stream=None) -> None:
        K.write(self.tvals, slots, rows, accumulate)
        self.unscored = self.unscored or self.tscore.shape[0] > 0   # an insert's commit: keys new to it score 0

    def get(self, keys, out=None, on_device=False, stream=None):
        if out is None:
            out = np.empty((keys.shape[0], self.dim), dtype=self.dtype)
        else:
            _check_out(out, (keys.shape[0], self.dim), self.dtype)
        found = np.empty(keys.shape[0], dtype=np.bool_)
        self.get_async(keys, out, found)
        return out, found

    def contains(self, keys, on_device=False, stream=None):
        found = np.empty(keys.shape[0], dtype=np.bool_)
        self.contains_async(keys, found)
        return found

    def erase(self, keys, stream=None) -> int:
        n = int(K.erase(self.tkeys, self.tstate, self.tvals, self.tscore, keys))
        self.tombstones += n
        return n

    # -- the asynchronous interface: on the CPU each call completes at once; counts wait for settle --
    def upsert_async(self, keys, rows, accumulate: bool, stream=None) -> None:
        n_new, n_revived = self.upsert(keys, rows, accumulate)
        self._pending[0] += n_new
        self._pending[1] += n_revived

    def get_async(self, keys, out, found, stream=None) -> None:
        K.get(self.tkeys, self.tstate, self.tvals, keys, out, found, _NONE, self.tombstones > 0)

    def find_rows(self, keys):
        """(rows (n, dim) a copy, slots (n,) int64: -1 where a key is not live) of validated ``keys``."""
        out = np.empty((keys.shape[0], self.dim), dtype=self.dtype)
        slots = np.empty(keys.shape[0], dtype=np.int64)
        K.get(self.tkeys, self.tstate, self.tvals, keys, out, _NO_FOUND, slots, self.tombstones > 0)
        return out, slots

    def write_at(self, keys, slots, rows) -> int:
        """Rows of ``keys`` written at the ``slots`` :meth:`find_rows` gave, all or nothing -> how many
        were stale (``_cpu_kernels.write_at``; 0: written)."""
        return int(K.write_at(self.tkeys, self.tstate, self.tvals, keys, slots, rows, self.tombstones > 0))

    def contains_async(self, keys, found, stream=None) -> None:
        K.contains(self.tkeys, self.tstate, keys, found, self.tombstones > 0)

    def erase_async(self, keys, stream=None) -> None:
        self._pending[3] += self.erase(keys)

    def lookup_async(self, keys, batch: int, slots, stream=None) -> None:
        C.lookup(self.tkeys, self.tstate, self.tscore, keys, batch, slots)

    def fill_claimed(self, slots, fill, batch: int) -> None:
        """``fill(tvals, slots)`` writes the rows of claimed ``slots`` (n,) int64 in place; then their
        scores count a use in ``batch``. A ``fill`` that raises leaves those rows zero (slots that
        are given back hold zeros) and propagates."""
        try:
            fill(self.tvals, slots)
        except BaseException:
            self.tvals[slots] = 0   # an error path: slots given back hold zeros
            raise
        if self.tscore.shape[0]:
            C.use_slots(self.tscore, slots, batch)

    def evict(self, n: int, protect: int, n_live: int, stream=None):
        """(keys (k,) uint64, rows (k, dim)) of the k <= n victims (``_cache.py``), erased; key order."""
        keys, slots = self.victims(n, protect)
        rows = np.take(self.tvals, slots, axis=0)   # rows gathered once, in key order (take: whole rows)
        self.erase_victims(slots)
        return keys, rows

    def victims(self, n: int, protect: int):
        """(keys (k,) uint64, slots (k,) int64) of the k <= n victims (``_cache.py``), in key order, still
        live: their rows are ``tvals[slots]`` until :meth:`erase_victims`."""
        if self.unscored:   # settle it: a key inserted since may have been looked up
            self.unscored = bool(C.any_unscored(self.tkeys, self.tstate, self.tscore))
        slots = C.victim_slots(self.tkeys, self.tstate, self.tscore, protect, n, not self.unscored, self._hint)
        keys = self.tkeys[slots]
        o = np.argsort(keys)   # distinct keys: one order, whatever the sort
        return keys[o], slots[o]

    def erase_victims(self, slots, hidden: bool = False) -> None:
        """Erase the :meth:`victims` at ``slots`` (tombstones, rows and scores zeroed); ``hidden``: they
        are tombstones already (:meth:`hide`), and are counted."""
        if hidden:   # their states are not written: the row path may read them meanwhile
            C.zero_slots(self.tvals, self.tscore, slots)
            return
        C.erase_slots(self.tstate, self.tvals, self.tscore, slots)
        self.tombstones += slots.shape[0]

    def hide(self, slots) -> None:
        """Live ``slots`` (m,) int64, distinct, become tombstones that keep their rows (and scores): no
        lookup finds them, no call reads or writes their rows, until :meth:`unhide` (or
        :meth:`erase_victims`, hidden) -- the slots of an eviction's sink or an insert's fill, which run
        while the train step's row access goes on (``_rows.py``)."""
        self.tstate[slots] = 1
        self.tombstones += slots.shape[0]

    def unhide(self, slots) -> None:
        """:meth:`hide` undone: the slots are live again, with their rows and scores."""
        self.tstate[slots] = 0
        self.tombstones -= slots.shape[0]

    def settle(self) -> np.ndarray:
        """(4,) int64 counts of the ``*_async`` calls since the last settle: new, revived, failed, erased."""
        got, self._pending = self._pending, np.zeros(4, np.int64)
        return got

    def export(self, n_live: int | None = None):
        """(keys (m,) uint64, rows (m, dim)) of the live entries, in slot order (``n_live``: the CUDA
        twin's argument, not needed here)."""
        slots = K.live_slots(self.tkeys, self.tstate)
        return self.tkeys[slots], self.tvals[slots]

    def live_keys(self, n_live: int | None = None) -> np.ndarray:
        """(m,) uint64 copy of the live keys, in slot order; no row is read (``n_live``: the CUDA
        twin's argument, not needed here)."""
        return self.tkeys[K.live_slots(self.tkeys, self.tstate)]

    def regrow(self, n_slots: int):
        """A growth to ``n_slots`` slots made ready without reading or writing a row, for
        :meth:`rebuild`: new arrays written (their pages faulted in: most of a growth's time), the live
        keys claimed in them, their scores copied -> (arrays, old slots, new slots). Reads keys, states
        and scores only, so the row path may run meanwhile (``_rows.py``)."""
        old = K.live_slots(self.tkeys, self.tstate)
        fresh = CpuTableImpl(n_slots, self.dim, self.dtype, scores=self.tscore.shape[0] > 0)  # written (__init__)
        arrays = (fresh.tkeys, fresh.tstate, fresh.tvals, fresh.tscore)
        new = np.empty(old.shape[0], np.int64)
        K.claim(arrays[0], arrays[1], self.tkeys[old], new, np.empty(old.shape[0], np.int8), ahead_ring())
        if arrays[3].shape[0]:
            arrays[3][new] = self.tscore[old]
        return arrays, old, new

    def rebuild(self, n_slots: int, n_live: int | None = None, plan=None) -> None:
        """Re-lay the live entries into ``n_slots`` (>= the current count) slots, dropping every
        tombstone; growing makes the new arrays ready (:meth:`regrow`, or ``plan``, its result) before
        anything changes, then copies the rows over."""
        if plan is None and n_slots != self.n_slots:
            plan = self.regrow(n_slots)
        if plan is not None:
            arrays, old, new = plan
            K.move_rows(self.tvals, old, arrays[2], new)
            self.tkeys, self.tstate, self.tvals, self.tscore = arrays
            self.n_slots, self.tombstones = n_slots, 0
            return
        slots = K.live_slots(self.tkeys, self.tstate)
        scored = self.tscore.shape[0] > 0
        keys, rows, scores = self.tkeys[slots], self.tvals[slots], self.tscore[slots] if scored else None
        unscored = self.unscored   # the same keys and scores come back
        self.clear()
        K.upsert(self.tkeys, self.tstate, self.tvals, keys, rows, False)
        if scored:
            C.set_scores(self.tkeys, self.tscore, keys, scores)
        self.unscored = unscored

    def clear(self) -> None:
        self.tkeys.fill(EMPTY_KEY)
        self.tstate.fill(0)
        self.tvals.fill(0)
        self.tscore.fill(0)
        self.tombstones = 0
        #: a live slot may score 0 (a key inserted, never looked up): :meth:`victims` then reads the keys
        #: and states too (``_cache_kernels_cpu.victim_slots``); False promises none does
        self.unscored = False


def _check_out(out, shape, dtype) -> None:
    """``out`` must be a writable C-contiguous host array of exactly ``shape`` and ``dtype``."""
    if not isinstance(out, np.ndarray) or out.dtype != dtype:
        raise InvalidTypeError(f"out must be a NumPy array of {dtype}, got "
                               f"{type(out).__name__} {getattr(out, 'dtype', '')}")
    if out.shape != shape or not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidInputError(f"out must be a writable C-contiguous array of shape {shape}, got {out.shape}")
