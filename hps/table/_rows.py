"""The train step's access to the rows of resident keys (``--device cpu``: the CPU twin of the HBM-PS):
:meth:`RowOps.find_rows` copies the rows of a mini-batch's keys out with the slots they were found at
and :meth:`RowOps.write_rows` assigns the updated rows back at those slots, so a step probes each key
once (a ``get``, then an ``insert`` that probes every key again, did it twice).

Locking (a CPU table): the table has two locks, always taken in this order. ``_lock`` serialises every
call but these two; ``_rows`` guards the keys, states and rows of live slots. ``find_rows`` and
``write_rows``' ``write_at`` (the row path) take ``_rows`` alone, so the train step does not wait for
the prepare stage's long calls, which hold ``_lock`` and take ``_rows`` only while they change a key, a
state, the tombstone count or the arrays (a claim, an erase, a hide or unhide, a re-lay): the residency
lookup (``lookup``/``missing``: it writes scores, which the row path never reads), the choice of victims
(it reads keys, states and scores, which only ``_lock``'s holder changes), an eviction's ``sink`` and an
insert's ``fill`` (``_cache.py``: they read or write the rows of slots hidden first -- tombstones that
keep their rows, which no lookup finds, no call but theirs reads or writes, and no claim reuses, as
claims need ``_lock``), and a growth made ready (``reserve``: the new arrays written, the keys claimed
in them; only the rows' copy holds ``_rows``). Shared writes while both run (Numba kernels, nogil, on
two cores): the row path writes only rows of slots live under ``_rows``, and reads keys and states that
only ``_rows``' holders change; prepare writes scores, the rows of hidden slots, and fresh arrays no one
else sees; no memory is written by both. A key hidden after ``find_rows`` found it live is stale to
``write_at``, which then writes nothing: the row goes through ``insert``, which waits for ``_lock``, so
it lands after the eviction. Every other call holds both locks where it reads or writes rows (``get``,
``export``, ``device_view``...), so each call of the table stays atomic.

Validation happens once, where keys enter a job: the prepare stage's residency lookup
(:meth:`~hps.table._cache.CacheOps.missing`) refuses the sentinel key, and the step's keys are a subset
of the working set it looked up. So these two check only the arrays' type and shape (O(1)), not every
key (``hps._keys.as_keys``' O(n) sentinel scan); they stay safe with any input: a sentinel key is never
live (``find_rows`` answers it absent, slot -1), and ``write_rows`` writes only at slots that still
hold their key live, else it runs as :meth:`HashTable.insert` (which refuses the sentinel, typed).
"""

from __future__ import annotations

import numpy as np

from .._keys import key_array
from ..errors import InvalidInputError


class RowOps:
    """The train step's row access of :class:`hps.HashTable` and :class:`hps.gpu.PartitionedHashTable`
    (a mixin). One CPU table finds slots and writes at them; any other table (parts, a GPU) answers
    through its ``get`` and ``insert``, the slots then only saying which keys are live (0 / -1)."""

    def _row_impl(self):
        """The CPU backend that finds and writes at slots (``_cpu.CpuTableImpl``), else None."""
        impl = getattr(self, "_impl", None)
        return impl if impl is not None and impl.device == "cpu" else None

    def find_rows(self, keys):
        """(rows (n, dim) host array, this call's own copy; slots (n,) int64, -1 where a key is not
        live) of ``keys`` (n,) uint64 host, keys a validating call let in (see the module docstring).
        The slots are the hints :meth:`write_rows` takes. Blocking; thread-safe (the row lock alone on
        a CPU table: see the module docstring)."""
        k = key_array(keys)   # a 1-D C-contiguous uint64 array as it is: no copy, no scan
        impl = self._row_impl()
        if impl is None:
            rows, found = self.get(k)
            return rows, np.where(np.asarray(found), 0, -1).astype(np.int64)
        with self._rows:   # not the table's lock (see the module docstring)
            return impl.find_rows(k)

    def write_rows(self, keys, slots, rows) -> None:
        """Assign ``rows`` (n, dim) to ``keys`` (n,) uint64 host, ``slots`` (n,) int64 those of a
        :meth:`find_rows` of them: at those slots when every one still holds its key live (the usual
        case: no probe; the row lock alone on a CPU table), else at the slots the keys hold now when
        every one is live (the table re-laid since: probed again, under the row lock alone, so the
        step does not wait for the prepare stage's long calls), else exactly as ``insert`` (later
        duplicates win; raises as it does). Blocking; thread-safe."""
        k = key_array(keys)
        slots = np.asarray(slots)
        if slots.shape != k.shape or slots.dtype != np.int64 or not slots.flags.c_contiguous:
            raise InvalidInputError(f"slots must be ({k.shape[0]},) int64 C-contiguous, the slots of "
                                    f"find_rows, got {slots.shape} {slots.dtype}")
        impl = self._row_impl()
        if impl is not None and k.shape[0]:
            r = impl.rows_in(rows, k.shape[0], "rows")
            with self._rows:   # not the table's lock (see the module docstring)
                if impl.write_at(k, slots, r) == 0 or impl.write_at(k, impl.find_rows(k)[1], r) == 0:
                    return
        self.insert(k, rows)   # a key not live, or not one CPU table: by key
