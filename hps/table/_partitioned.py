"""``PartitionedHashTable``: one logical table split over several parts (Algorithm 2 of
``shared/seeds/004``, Section 4.1): keys are partitioned by a key -> part policy, scattered to their
part, applied per part, and the results gathered back in input order.

Parts live on ``device``: on ``"cuda"`` part ``p`` lives on GPU ``p % gpus`` (``hps.gpu.Placement``;
with one GPU all parts share it); on ``"cpu"`` they are CPU tables. The batch calls here partition on
the host with Numba kernels (device inputs are staged); the per-part operations run on each part's
device. GPU-resident training partitions its device batches on the device instead
(``hps.gpu.partition_keys``) and runs its kernels on every part's rows in place through
:meth:`device_views`.

Policy: part of ``key`` = ``mix64(key ^ PART_SALT) % n_parts`` (``hps._hashing``), independent of the
slot hash and of the key -> node policy.

Capacity: the whole table accepts ``capacity`` keys; each part accepts ``part_capacity`` (default
``ceil(1.25 * capacity / n_parts) + 64``; keys spread by a hash, so a part fills first only near full
capacity). A call that passes either raises :class:`HashTableFullError` and changes nothing in any part:
all parts claim first, then all commit or all roll back.

Thread safety: calls are serialised by the parts' locks (always taken in part order).
"""

from __future__ import annotations

import contextlib
import math

import numpy as np

from .._checks import positive_int
from .._hashing import PART_SALT, group_by_owner, owner_of
from .._keys import as_keys, check_rows
from ..errors import HashTableFullError, InvalidInputError
from ._cache import in_key_order
from ._hashtable import DEFAULT_MAX_LOAD_FACTOR, HashTable
from ._placement import Placement
from ._rows import RowOps


def _to_host(arr):
    # simulator device arrays have no __cuda_array_interface__, only __cuda_ndarray__
    if hasattr(arr, "__cuda_array_interface__") or getattr(arr, "__cuda_ndarray__", False):
        from numba import cuda

        return cuda.as_cuda_array(arr).copy_to_host(), True
    return arr, False


def _default_part_capacity(capacity: int, n_parts: int) -> int:
    return min(capacity, math.ceil(1.25 * capacity / n_parts) + 64)


class PartitionedHashTable(RowOps):
    """Same API and answers as :class:`hps.HashTable`, over ``n_parts`` part tables."""

    def __init__(self, n_parts: int, capacity: int, dim: int, device: str = "cpu", dtype=np.float32,
                 max_load_factor: float = DEFAULT_MAX_LOAD_FACTOR, part_capacity: int | None = None,
                 gpus: int | None = None):
        self.n_parts = positive_int(n_parts, "n_parts")
        self._capacity = positive_int(capacity, "capacity")
        if part_capacity is None:
            part_capacity = _default_part_capacity(self._capacity, self.n_parts)
        self.part_capacity = int(part_capacity)
        #: which GPU each part is on (``device == "cuda"``; None on the CPU)
        self.placement = Placement(self.n_parts, gpus) if device == "cuda" else None
        self._ctx = ([lambda p=p: self.placement.use(p) for p in range(self.n_parts)] if self.placement
                     else [contextlib.nullcontext] * self.n_parts)
        self.parts: list[HashTable] = []
        for p in range(self.n_parts):
            with self._ctx[p]():
                self.parts.append(HashTable(self.part_capacity, dim, device, dtype, max_load_factor))

    # -- properties -----------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def dim(self) -> int:
        return self.parts[0].dim

    @property
    def dtype(self):
        return self.parts[0].dtype

    @property
    def device(self) -> str:
        return self.parts[0].device

    @property
    def load_factor(self) -> float:
        return len(self) / sum(p.n_slots for p in self.parts)

    def __len__(self) -> int:
        return sum(len(p) for p in self.parts)

    def __repr__(self) -> str:
        return (f"PartitionedHashTable(n_parts={self.n_parts}, capacity={self._capacity}, dim={self.dim}, "
                f"device={self.device!r}, size={len(self)})")

    # -- partitioning -----------------------------------------------------------------------------------
    def _split(self, keys):
        """(host keys, on_device, order, offsets): keys[order[offsets[p]:offsets[p+1]]] go to part p."""
        host, on_dev = _to_host(keys)
        k = as_keys(host)
        order, offsets = group_by_owner(owner_of(k, self.n_parts, PART_SALT), self.n_parts)
        return k, on_dev, order, offsets

    def _each(self, order, offsets):
        for p in range(self.n_parts):
            idx = order[offsets[p]:offsets[p + 1]]
            if idx.shape[0]:
                yield p, idx

    @contextlib.contextmanager
    def _locked(self):
        with contextlib.ExitStack() as stack:
            for part in self.parts:
                stack.enter_context(part._lock)
            yield

    @staticmethod
    def _out(arr, on_dev):
        if on_dev:
            from numba import cuda

            return cuda.to_device(arr)
        return arr

    @contextlib.contextmanager
    def device_views(self):
        """``with table.device_views() as views:`` the :class:`~hps.table.TableView` of every part (part
        p's on its own device), every part's lock held for the block, taken in part order; see
        :meth:`HashTable.device_view` for what kernels may do with them."""
        with contextlib.ExitStack() as stack:
            views = []
            for p, part in enumerate(self.parts):
                with self._ctx[p]():
                    views.append(stack.enter_context(part.device_view()))
            yield views

    # -- operations -----------------------------------------------------------------------------------
    def insert(self, keys, values) -> None:
        """Insert or assign (later duplicates win); atomic across parts."""
        self._upsert(keys, values, accumulate=False)

    def accumulate(self, keys, deltas) -> None:
        """Add deltas; missing keys start from zeros; atomic across parts."""
        self._upsert(keys, deltas, accumulate=True)

    def _upsert(self, keys, rows, accumulate: bool) -> None:
        k, _, order, offsets = self._split(keys)
        r = check_rows(_to_host(rows)[0], k.shape[0], self.dim, self.dtype,
                       "deltas" if accumulate else "values")
        if k.shape[0] == 0:
            return
        with self._locked():
            shares = list(self._each(order, offsets))
            if len(self) + k.shape[0] <= self._capacity and all(
                    len(self.parts[p]) + idx.shape[0] <= self.part_capacity for p, idx in shares):
                # room for every key in every part even if all are new: no part can fail
                for p, idx in shares:
                    with self._ctx[p]():
                        self.parts[p]._upsert(k[idx], r[idx], accumulate)
                return
            tickets = []
            try:
                for p, idx in shares:
                    part = self.parts[p]
                    with self._ctx[p]():
                        kp, _ = part._impl.keys_in(k[idx])
                        tickets.append((p, idx, part._claim(kp)))
                n_new = sum(t[2][2] for t in tickets)
                if len(self) + n_new > self._capacity:
                    raise HashTableFullError(
                        f"PartitionedHashTable is full: {len(self)} live keys + {n_new} new keys > capacity "
                        f"{self._capacity}; nothing was changed")
            except HashTableFullError:
                for p, _, ticket in reversed(tickets):
                    with self._ctx[p]():
                        self.parts[p]._rollback(ticket)
                raise
            for p, idx, ticket in tickets:
                part = self.parts[p]
                with self._ctx[p]():
                    part._commit(ticket, part._impl.rows_in(r[idx], idx.shape[0]), accumulate)

    def get(self, keys):
        """(values (n, dim), found (n,) bool), in input order."""
        k, on_dev, order, offsets = self._split(keys)
        vals = np.zeros((k.shape[0], self.dim), dtype=self.dtype)
        found = np.zeros(k.shape[0], dtype=np.bool_)
        for p, idx in self._each(order, offsets):
            with self._ctx[p]():
                v, f = self.parts[p].get(k[idx])
            vals[idx], found[idx] = v, f
        return self._out(vals, on_dev), self._out(found, on_dev)

    def contains(self, keys):
        k, on_dev, order, offsets = self._split(keys)
        found = np.zeros(k.shape[0], dtype=np.bool_)
        for p, idx in self._each(order, offsets):
            with self._ctx[p]():
                found[idx] = self.parts[p].contains(k[idx])
        return self._out(found, on_dev)

    def erase(self, keys) -> int:
        k, _, order, offsets = self._split(keys)
        n = 0
        for p, idx in self._each(order, offsets):
            with self._ctx[p]():
                n += self.parts[p].erase(k[idx])
        return n

    def export(self):
        """(keys (m,) uint64, values (m, dim)) of every live entry, host arrays."""
        outs = []
        for p, part in enumerate(self.parts):
            with self._ctx[p]():
                outs.append(part.export())
        return (np.concatenate([o[0] for o in outs]),
                np.concatenate([o[1] for o in outs]).reshape(-1, self.dim))

    def live_keys(self) -> np.ndarray:
        """(m,) uint64 host array of every live key (no row is copied)."""
        outs = []
        for p, part in enumerate(self.parts):
            with self._ctx[p]():
                outs.append(part.live_keys())
        return np.concatenate(outs)

    def lookup(self, keys, batch: int):
        """Slots (n,) int64 of ``keys`` in their parts (-1 where not live), each live key counting a use
        in ``batch`` (:meth:`HashTable.lookup`). Blocking."""
        k, on_dev, order, offsets = self._split(keys)
        slots = np.full(k.shape[0], -1, np.int64)
        for p, idx in self._each(order, offsets):
            with self._ctx[p]():
                slots[idx] = _to_host(self.parts[p].lookup(k[idx], batch))[0]
        return self._out(slots, on_dev)

    def missing(self, keys, batch: int) -> np.ndarray:
        """The keys of host ``keys`` that are not live, in input order, each live key counting a use in
        ``batch`` (:meth:`HashTable.missing`). Blocking."""
        k = np.asarray(keys, np.uint64)
        return k[np.asarray(self.lookup(k, batch)) < 0]

    def evict(self, n: int, protect_from: int):
        """Erase up to ``n`` victims over the parts (:meth:`HashTable.evict` in each) -> (keys, rows) host
        arrays in key order. Part p gives its share of ``n`` by its live keys (floor, the remainder to
        the first parts), then the parts in order make up what another could not give: a choice that
        depends only on the parts' contents. Blocking."""
        if int(n) != n or n < 0:
            raise InvalidInputError(f"n must be a non-negative integer, got {n!r}")
        sizes = np.array([len(p) for p in self.parts], np.int64)
        total = int(sizes.sum())
        if n == 0 or total == 0:
            return np.empty(0, np.uint64), np.empty((0, self.dim), self.dtype)
        share = sizes * int(n) // total
        share[:int(n) - int(share.sum())] += 1
        got = []
        for rnd in range(2):
            left = int(n) - sum(k.shape[0] for k, _ in got)
            for p in range(self.n_parts):
                want = int(share[p]) if rnd == 0 else left
                if want <= 0:
                    continue
                with self._ctx[p]():
                    k, r = self.parts[p].evict(want, protect_from)
                got.append((k, r))
                left -= k.shape[0] if rnd else 0
        return in_key_order(np.concatenate([k for k, _ in got]),   # a key lives in one part
                            np.concatenate([r for _, r in got]).reshape(-1, self.dim))

    def reserve(self, capacity: int, part_capacity: int | None = None) -> None:
        """Grow to ``capacity`` live keys, each part to ``part_capacity`` (default: the constructor's
        rule for the new capacity), keeping every entry; never shrinks (see :meth:`HashTable.reserve`).
        Parts grow one by one on their devices; if one fails (out of memory) the parts already grown
        keep their entries and the logical capacities stay as they were."""
        capacity = positive_int(capacity, "capacity")
        if part_capacity is None:
            part_capacity = _default_part_capacity(int(capacity), self.n_parts)
        pc = int(part_capacity)
        with self._locked():
            for p, part in enumerate(self.parts):
                with self._ctx[p]():
                    part.reserve(pc)
            self._capacity = max(self._capacity, int(capacity))
            self.part_capacity = max(self.part_capacity, pc)

    def purge(self) -> None:
        """Drop the tombstones of every part, in place on its device (see :meth:`HashTable.purge`)."""
        for p, part in enumerate(self.parts):
            with self._ctx[p]():
                part.purge()

    def clear(self) -> None:
        for p, part in enumerate(self.parts):
            with self._ctx[p]():
                part.clear()
