"""``Reserved``: an array that grows and shrinks in place inside address space reserved up front.

A ``RowCache`` of a large budget starts small and grows as rows arrive (``_slots.CacheSlots``).
``ndarray.resize`` (``realloc``) grows a block by remapping it, but zero-fills the grown part at once,
faulting it all in (on the 2-core VM 0.22 s for 256 MiB) whether rows ever come to it or not. Here each
array is a view of a private anonymous mapping of the most elements it may hold (``MAP_NORESERVE``:
address space, not memory; no page is resident until written). Growing is taking a longer view of it
(the new part reads as zeros, as after ``resize``: :meth:`view` zeroes the bytes a shrink left behind),
so the old and the new array are never both in memory, nothing is copied or filled, and a page is
faulted in when a row is first written to it; shrinking gives the pages past the new end back to the
system (``MADV_DONTNEED``). Only a view past the reservation (a capacity raised after the reservation
was made) allocates a new mapping and copies the elements in use. The mappings are not advised to
huge pages (``MADV_HUGEPAGE``): faster on a quiet box (a first write of 512 MiB in 0.04 s against
0.37 s), but the 2 M-row job of ``bench/bench_host.py`` spent more system time with them on the VM
(10-11 s against 6), so the kernel's default stands.

Linux (POSIX ``mmap`` with ``madvise``). Not thread-safe: its owner serialises calls. REQUIRES: nobody
holds a view across a :meth:`view` that moves the array (the cache hands out copies only).
"""

from __future__ import annotations

import mmap
import sys

import numpy as np

_PAGE = mmap.PAGESIZE
#: mmap(2)'s MAP_NORESERVE (Linux's value where Python does not name it): reserve address space, not memory
_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


class Reserved:
    """Room for up to ``limit`` elements of shape ``tail`` and ``dtype`` (host memory, zero at first);
    :meth:`view` hands out the first ``n`` of them as an ``(n, *tail)`` C-contiguous writable array."""

    def __init__(self, limit: int, dtype, tail: tuple = ()):
        self.dtype = np.dtype(dtype)
        self.tail = tuple(int(t) for t in tail)
        self._item = self.dtype.itemsize * int(np.prod(self.tail, dtype=np.int64))
        self._map(int(limit), 0)
        self.n = 0

    def _map(self, limit: int, need: int) -> None:
        """A fresh mapping of ``limit`` elements (zero; nothing resident), of ``need`` when the system
        refuses to reserve that much address space (strict overcommit ignores MAP_NORESERVE). Raises
        OSError when it refuses ``need`` too, leaving the current mapping and its view as they were."""
        limit, need = max(int(limit), int(need), 1), max(int(need), 1)
        try:
            mm = mmap.mmap(-1, limit * self._item, flags=mmap.MAP_PRIVATE | _NORESERVE)
        except OSError:
            if limit == need:
                raise
            limit = need
            mm = mmap.mmap(-1, limit * self._item, flags=mmap.MAP_PRIVATE | _NORESERVE)
        self.limit, self._mm = limit, mm
        self._full = np.frombuffer(mm, dtype=self.dtype).reshape((limit, *self.tail))
        self._zero_from = 0   # elements at or past this index read as zeros (fresh or given back)

    def view(self, n: int, limit: int | None = None) -> np.ndarray:
        """The first ``n`` elements; past the previous view's end they read as zeros (as ``resize``
        leaves them). Beyond the reservation a new one of ``max(n, limit)`` elements is made and the
        elements in use are copied over (the only copy; the old mapping goes with its last view)."""
        n = int(n)
        if n > self.limit:
            old, keep = self._full, self.n
            self._map(max(n, int(limit or 0)), n)
            self._full[:keep] = old[:keep]
            self._zero_from = keep
        if n > self.n and self.n < self._zero_from:   # the bytes a shrink left before a page edge
            self._full[self.n:min(n, self._zero_from)] = 0
        if n < self.n:
            self._release(n)
        self.n = n
        self._zero_from = max(self._zero_from, n)
        return self._full[:n]

    def _release(self, n: int) -> None:
        """Give the whole pages past element ``n`` back to the system (they read as zeros again)."""
        start = -(-n * self._item // _PAGE) * _PAGE
        if start < len(self._mm):
            self._mm.madvise(mmap.MADV_DONTNEED, start, len(self._mm) - start)
        self._zero_from = min(self._zero_from, -(-start // self._item))   # a partly kept element is stale
