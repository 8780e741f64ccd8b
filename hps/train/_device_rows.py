"""Where a ``--device cuda`` mini-batch's rows are: one HBM-PS table on the main GPU
(:class:`OneTable`), or ``--n-parts`` parts spread over the node's GPUs (:class:`Parts`, Algorithm 2 of
``shared/seeds/004``: partition -> scatter -> apply per part -> gather).

Both give :class:`~hps.train._device_backend.DeviceBackend` the same calls, so the train step is written
once::

    keys = rows.split(keys, purpose)          # a device batch of keys (partitioned on the device)
    looked = rows.look(table, keys, batch)    # the residency lookup, launched under the table's lock
    miss = rows.misses(looked)                # ... and its misses, split as the keys were, after the lock
    slots = rows.find(view, keys, scalars)    # their slots in the table / in every part
    rows.pool(view, slots, keys, plan, out)   # pooled embeddings on the main GPU
    rows.gather(view, slots, keys, idx, out)  # out[i] = parameters of keys[idx[i]] (owner serving)
    rows.update(view, slots, keys, grads, opt)  # the row optimizer, in place, part by part
    rows.finish(scalars)                      # once per batch: the parts' counters onto the main GPU

``view`` is what ``LedgerTable.device_view()`` yields: one :class:`~hps.table.TableView`, or a list of
one per part; ``table`` the HBM-PS table itself (``HashTable`` or ``PartitionedHashTable``), whose lock(s)
the caller holds (for :meth:`~OneTable.misses`, no lock is needed). Everything is asynchronous except
:meth:`Parts.split`, which reads the n_parts counts (the only bytes partitioning brings to the host; the
caller names their purpose), :meth:`Parts.look`, and CuPy's read of how many keys :meth:`~OneTable.misses`
selects: that read waits for the lookup, queued on the legacy stream behind the train stage's kernels, so
the caller makes it with the table's lock released and the train stage goes on launching meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gpu import (
    Placement,
    TransferLedger,
    find_slots_async,
    gather_rows_async,
    lookup_slots,
    missing_keys,
    partition_keys,
    pool_forward_async,
    pool_forward_rows_async,
    sparse_update_async,
)

__all__ = ["OneTable", "Parts", "PartKeys"]


class OneTable:
    """A one-part HBM-PS: the kernels work on the table's slots directly."""

    def __init__(self, xp, width: int):
        self.xp, self.width = xp, int(width)

    def split(self, keys, purpose: str):
        return keys

    def look(self, table, keys, batch: int):
        """Launch the residency lookup of ``keys`` (u,) uint64 on the device in ``table`` (an ``HashTable``),
        each key it holds counting a use in ``batch`` (``hps.gpu.lookup_slots``); asynchronous. What
        :meth:`misses` takes."""
        return keys, lookup_slots(table, keys, batch, self.xp)

    @staticmethod
    def misses(looked):
        """The keys of a :meth:`look` that ``table`` does not hold, in input order. Blocks (CuPy counts
        them); needs no lock."""
        keys, slots = looked
        return keys[slots < 0]

    @staticmethod
    def flat(keys):
        """The (u,) uint64 device array of keys as :meth:`split` gives them."""
        return keys

    def find(self, view, keys, scalars):
        slots = self.xp.empty(keys.shape[0], np.int64)
        find_slots_async(view, keys, slots, scalars.missing)
        return slots

    def pool(self, view, slots, keys, d, out) -> None:
        pool_forward_async(view, slots, d.inv, d.field, d.weights, d.offsets, out, width=self.width)

    def gather(self, view, slots, keys, idx, out) -> None:
        gather_rows_async(view, slots, idx, out)

    def update(self, view, slots, keys, grads, opt) -> None:
        sparse_update_async(view, slots, grads, opt)

    def finish(self, scalars) -> None:
        pass


@dataclass
class PartKeys:
    """A device batch of keys partitioned on the device: ``keys`` (u,) uint64 on the main GPU;
    ``index[p]`` (u_p,) int64 on the main GPU, the positions in ``keys`` of part p's keys, in input
    order; ``local[p]`` (u_p,) uint64 on part p's GPU, those keys."""

    keys: object
    index: list
    local: list

    @property
    def shape(self):
        return self.keys.shape


class Parts:
    """An HBM-PS of several parts (``PartitionedHashTable``), part p on GPU ``placement.device(p)``.

    Per mini-batch the slots are found part by part on each part's GPU; the parameters the main GPU
    needs are gathered there and copied over (``peer_bytes``); each key's gradient goes back to its
    part's GPU and the optimizer updates the rows in place there. Per-part missing-key counters live
    on the parts' GPUs and are added onto the main GPU's :class:`BatchScalars` once per batch."""

    def __init__(self, xp, width: int, placement: Placement, ledger: TransferLedger):
        self.xp, self.width, self.place, self.ledger = xp, int(width), placement, ledger
        self.n = placement.n_parts
        self._missing = []
        for p in range(self.n):
            with placement.use(p):
                self._missing.append(xp.zeros(2, np.float64))  # [loss (unused), missing] as BatchScalars

    def _to(self, a, p: int):
        return self.place.peer(a, 0, self.place.device(p), self.ledger)

    def _from(self, a, p: int):
        return self.place.peer(a, self.place.device(p), 0, self.ledger)

    def split(self, keys, purpose: str) -> PartKeys:
        """Partition ``keys`` (u,) uint64 on the main GPU by the parts' policy, on the device; the
        n_parts counts cross to the host as ``purpose``. Blocking (for the counts)."""
        order, offsets = partition_keys(keys, self.n, self.xp, self.ledger, purpose)
        index = [order[offsets[p]:offsets[p + 1]] for p in range(self.n)]
        return PartKeys(keys, index, [self._to(keys[i], p) for p, i in enumerate(index)])

    def look(self, table, keys: PartKeys, batch: int) -> PartKeys:
        """The keys of ``keys`` that ``table`` (the ``PartitionedHashTable``) does not hold, in input order,
        each one it holds counting a use in ``batch``: part p's keys are looked up in ``table.parts[p]``
        on its GPU (``hps.gpu.missing_keys``, what ``PartitionedHashTable.missing`` does on host keys)
        and their slots copied to the main GPU. The misses come partitioned as ``keys`` were (each part's
        share of them filtered on its GPU, their positions among the misses on the main GPU), so a
        lookup of them again, after they were inserted, partitions nothing and brings nothing to the host."""
        xp = self.xp
        slots, local = xp.empty(keys.shape[0], np.int64), []
        for p in range(self.n):
            with self.place.use(p):
                s, m = missing_keys(table.parts[p], keys.local[p], batch, xp)
                local.append(m)
            slots[keys.index[p]] = self._from(s, p)
        miss = slots < 0
        at = xp.cumsum(miss) - 1  # each key's position among the misses
        return PartKeys(keys.keys[miss], [at[i][miss[i]] for i in keys.index], local)

    @staticmethod
    def misses(looked: PartKeys) -> PartKeys:
        """:meth:`look` found them already (partitioning reads counts on the host anyway)."""
        return looked

    @staticmethod
    def flat(keys: PartKeys):
        """The (u,) uint64 device array on the main GPU of keys as :meth:`split` gives them."""
        return keys.keys

    def find(self, views, keys: PartKeys, scalars):
        slots = []
        for p in range(self.n):
            with self.place.use(p):
                s = self.xp.empty(keys.local[p].shape[0], np.int64)
                find_slots_async(views[p], keys.local[p], s, self._missing[p][1:2])
            slots.append(s)
        return slots

    def _rows(self, views, slots, keys: PartKeys):
        """(u, width) on the main GPU: the parameter columns of every key's row, in key order."""
        out = self.xp.empty((keys.shape[0], self.width), views[0].values.dtype)
        for p in range(self.n):
            m = keys.local[p].shape[0]
            if not m:
                continue
            with self.place.use(p):
                part = self.xp.empty((m, self.width), out.dtype)
                gather_rows_async(views[p], slots[p], self.xp.arange(m, dtype=np.int64), part)
            out[keys.index[p]] = self._from(part, p)
        return out

    def pool(self, views, slots, keys: PartKeys, d, out) -> None:
        rows = self._rows(views, slots, keys)
        pool_forward_rows_async(rows, self.xp.arange(rows.shape[0], dtype=np.int64), d.inv, d.field,
                                d.weights, d.offsets, out)

    def gather(self, views, slots, keys: PartKeys, idx, out) -> None:
        out[...] = self._rows(views, slots, keys)[idx]

    def update(self, views, slots, keys: PartKeys, grads, opt) -> None:
        for p in range(self.n):
            if not keys.local[p].shape[0]:
                continue
            g = self._to(self.xp.ascontiguousarray(grads[keys.index[p]]), p)
            with self.place.use(p):
                sparse_update_async(views[p], slots[p], g, opt)

    def finish(self, scalars) -> None:
        for p in range(self.n):
            scalars.add(self._from(self._missing[p], p))
            with self.place.use(p):
                self._missing[p][...] = 0
