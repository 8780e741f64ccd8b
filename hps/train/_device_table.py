"""``LedgerTable``: the HBM-PS as the hierarchy sees it on ``--device cuda`` (``_device_backend``), its
copies counted by the transfer ledger."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidTypeError
from ..gpu import TransferLedger, init_rows_async
from ._device_batch import DeviceKeys
from ._device_rows import Parts

__all__ = ["LedgerTable"]


class LedgerTable:
    """The HBM-PS as :class:`~hps.train._hierarchy.ParameterHierarchy` uses it on ``--device cuda``: the
    table's batch calls on host arrays, every copy counted by the ledger — keys and rows going in as
    ``fetch``, keys of evictions and lookups and the rows coming out as ``writeback``. The train stage
    reaches the rows through :meth:`device_view` only. Thread safety: the table's (its lock).

    A :class:`~hps.gpu.PartitionedHashTable` gets the host arrays themselves: they are split on the
    host, where they are, and each part uploads its own share to its GPU (the ledger records those
    copies); ``device_view`` then yields the list of the parts' views. Its residency lookup
    (:meth:`missing`) runs on the device all the same: ``placed`` (``_device_rows.Parts``) partitions
    the keys there and looks each part's share up on its GPU.

    ``placed``: where the rows are, ``_device_rows.Parts`` for a partitioned ``table``, else
    ``_device_rows.OneTable``; raises InvalidTypeError when the two disagree."""

    def __init__(self, table, ledger: TransferLedger, placed):
        self.table = table
        self.ledger = ledger
        self.parted = hasattr(table, "device_views")
        if isinstance(placed, Parts) != self.parted:
            raise InvalidTypeError(f"LedgerTable: {type(placed).__name__} rows for a {type(table).__name__}; "
                                   "a PartitionedHashTable needs _device_rows.Parts, a HashTable OneTable")
        self.placed = placed
        # device copies of host keys, as ``placed.split`` gives them, for the next :meth:`missing` of the
        # same host array (which then uploads nothing): the last insert's, a kept working set's, and the
        # last misses' (the parts' insert of those keys reuses it: their share goes up with the rows)
        self._inserted = None  # (host keys, device keys) of the last insert
        self._kept = None      # (host keys, device copy not yet split) of a working set kept for missing
        self._missed = None    # (host keys, device keys) of the last missing's result

    def insert(self, keys: np.ndarray, rows: np.ndarray) -> None:
        """keys (n,) uint64, rows (n, row_width) host arrays. Blocking. When ``keys`` is the array the
        last :meth:`missing` returned, one table inserts the device copy of the misses it found, and
        only the rows go up; a partitioned table's parts upload their share of keys and rows. The keys'
        device copy is kept for a :meth:`missing` of the same array that follows (the hierarchy counts
        the inserted keys' first use so), which then uploads nothing."""
        missed = self._missed if self._missed is not None and self._missed[0] is keys else None
        if self.parted:
            self.ledger.record("h2d", "fetch", keys.nbytes + rows.nbytes)
            self.table.insert(keys, rows)
            self._inserted = missed
        else:  # the misses the last lookup found are on the device already: only their rows go up
            dev = self.ledger.to_device(keys, "fetch") if missed is None else missed[1]
            self.table.insert(dev, self.ledger.to_device(rows, "fetch"))
            self._inserted = (keys, dev)

    @property
    def births(self) -> bool:
        """Whether rows of keys new to every tier are made on the device (:meth:`insert_born`): one
        table; a partitioned table's parts take host rows."""
        return not self.parted

    def insert_born(self, keys: np.ndarray, rows: np.ndarray, born: np.ndarray, initializer) -> None:
        """:meth:`insert` where the rows ``born`` (n,) bool marks -- keys new to every tier, their rows in
        ``rows`` unwritten -- are made on the device by ``initializer``'s rule (``hps.gpu.init_rows_async``:
        the host's bits), so they cross nothing. The other rows go up (``fetch``), with their positions
        among ``keys`` (8 B each) when some rows are born; with none born, as :meth:`insert`. One table
        (:attr:`births`). Blocking."""
        n_born = int(np.count_nonzero(born))
        if n_born == 0:
            return self.insert(keys, rows)
        missed = self._missed if self._missed is not None and self._missed[0] is keys else None
        xp, led = self.ledger.xp, self.ledger
        dev = led.to_device(keys, "fetch") if missed is None else missed[1]
        dev_rows = xp.empty(rows.shape, rows.dtype)
        if n_born == keys.shape[0]:
            made = xp.arange(keys.shape[0], dtype=np.int64)
        else:
            known = np.flatnonzero(~born)
            at = led.to_device(known, "fetch")
            dev_rows[at] = led.to_device(rows[known], "fetch")
            mask = xp.ones(keys.shape[0], np.bool_)
            mask[at] = False
            made = xp.flatnonzero(mask)
        with self.device_view():  # a launch on this table's device, under its lock like every other
            init_rows_async(dev, made, initializer, dev_rows)
        self.table.insert(dev, dev_rows)
        self._inserted = (keys, dev)

    def keep(self, keys: np.ndarray, dev) -> None:
        """Keep ``dev``, the device copy of the host working set ``keys``, for the :meth:`missing` of
        that very array that follows (it then uploads nothing). Prepare thread, like :meth:`missing`."""
        self._kept = (keys, dev)

    def get(self, keys: np.ndarray):
        """(rows (n, row_width), found (n,) bool) host arrays of host ``keys``. Blocking."""
        if self.parted:
            rows, found = self.table.get(keys)
            self.ledger.record("h2d", "writeback", keys.nbytes)
            self.ledger.record("d2h", "writeback", rows.nbytes + found.nbytes)
            return rows, found
        rows, found = self.table.get(self.ledger.to_device(keys, "writeback"))
        return self.ledger.to_host(rows, "writeback"), self.ledger.to_host(found, "writeback")

    def erase(self, keys: np.ndarray) -> int:
        if self.parted:
            self.ledger.record("h2d", "writeback", keys.nbytes)
            return self.table.erase(keys)
        return self.table.erase(self.ledger.to_device(keys, "writeback"))

    def missing(self, keys, batch: int) -> np.ndarray:
        """The keys of ``keys`` (n,) uint64 not resident, in input order (host array), each resident key
        counting a use in ``batch``: the residency lookup and the miss list computed on the device
        (``hps.gpu.missing_keys``). ``keys``: a host array, which goes up (``plan``), or keys already on
        the device (:class:`~hps.train._device_batch.DeviceKeys`: a working set deduplicated there; the
        array of the last :meth:`insert` or :meth:`keep`, whose device copy it kept; with parts also the
        array of the last misses this returned, once inserted), which do not. Only the misses come down
        (``plan``, 8 B a key); with parts, partitioning the keys on the device brings n_parts counts down
        too (``plan``, 8 B a part), unless they were partitioned already (the misses once inserted).
        Blocking."""
        last, self._inserted = self._inserted, None
        kept, self._kept = self._kept, None
        self._missed = None
        # the table's lock(s): the simulator runs one thread's kernels at a time
        with self.device_view():
            if last is not None and last[0] is keys:
                dev = last[1]
            else:
                if isinstance(keys, DeviceKeys):
                    dev = keys.keys
                elif kept is not None and kept[0] is keys:
                    dev = kept[1]
                else:
                    dev = self.ledger.to_device(keys, "plan")
                dev = self.placed.split(dev, "plan")
            looked = self.placed.look(self.table, dev, batch)
        # selecting the misses waits for the lookup, queued behind the train stage's kernels: without
        # the lock, so the train thread goes on launching meanwhile
        miss = self.placed.misses(looked)
        host = self.ledger.to_host(self.placed.flat(miss), "plan")
        self._missed = (host, miss)
        return host

    def evict(self, n: int, protect_from: int):
        """The table's ``evict`` (host keys and rows, ``writeback``). Blocking."""
        keys, rows = self.table.evict(n, protect_from)
        self.ledger.record("d2h", "writeback", keys.nbytes + rows.nbytes)
        return keys, rows

    def export(self):
        """(keys, rows) host arrays of every resident row (``writeback``). Blocking."""
        keys, rows = self.table.export()
        self.ledger.record("d2h", "writeback", keys.nbytes + rows.nbytes)
        return keys, rows

    def live_keys(self) -> np.ndarray:
        """The table's ``live_keys`` (host keys, ``writeback``: what lists them for the job's model
        size). Blocking."""
        keys = self.table.live_keys()
        self.ledger.record("d2h", "writeback", keys.nbytes)
        return keys

    def clear(self) -> None:
        self.table.clear()

    def reserve(self, capacity: int) -> None:
        self.table.reserve(capacity)

    def device_view(self):
        """The table's view (one part) or the list of its parts' views, its lock(s) held."""
        return self.table.device_views() if self.parted else self.table.device_view()

    @property
    def capacity(self) -> int:
        return self.table.capacity

    def __len__(self) -> int:
        return len(self.table)
