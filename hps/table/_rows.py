"""The train step's access to the rows of resident keys (``--device cpu``: the CPU twin of the HBM-PS):
:meth:`RowOps.find_rows` copies the rows of a mini-batch's keys out with the slots they were found at
and :meth:`RowOps.write_rows` assigns the updated rows back at those slots, so a step probes each key
once (a ``get``, then an ``insert`` that probes every key again, did it twice).

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
        The slots are the hints :meth:`write_rows` takes. Blocking; thread-safe (the table's lock)."""
        k = key_array(keys)   # a 1-D C-contiguous uint64 array as it is: no copy, no scan
        impl = self._row_impl()
        if impl is None:
            rows, found = self.get(k)
            return rows, np.where(np.asarray(found), 0, -1).astype(np.int64)
        with self._lock:
            self._settle()
            return impl.find_rows(k)

    def write_rows(self, keys, slots, rows) -> None:
        """Assign ``rows`` (n, dim) to ``keys`` (n,) uint64 host, ``slots`` (n,) int64 those of a
        :meth:`find_rows` of them: at those slots when every one still holds its key live (the usual
        case: no probe), else exactly as ``insert`` (later duplicates win; raises as it does).
        Blocking; thread-safe."""
        k = key_array(keys)
        slots = np.asarray(slots)
        if slots.shape != k.shape or slots.dtype != np.int64 or not slots.flags.c_contiguous:
            raise InvalidInputError(f"slots must be ({k.shape[0]},) int64 C-contiguous, the slots of "
                                    f"find_rows, got {slots.shape} {slots.dtype}")
        impl = self._row_impl()
        if impl is not None and k.shape[0]:
            with self._lock:
                self._settle()
                if impl.write_at(k, slots, impl.rows_in(rows, k.shape[0], "rows")) == 0:
                    return
        self.insert(k, rows)   # a stale slot, or not one CPU table: by key
