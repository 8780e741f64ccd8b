"""``ParameterHierarchy``: HBM-PS over MEM-PS over SSD-PS for one process (Algorithm 1 of ``seeds/004``).

Rows (embedding | optimizer state) are authoritative in exactly one place at a time:

- a key of an in-flight batch is **resident** in the HBM-PS table and only the train stage changes it;
- every other key lives in the MEM-PS cache of its owner rank or, evicted from there, in its SSD-PS.

The tiers are exclusive: once ``prepare`` has fetched a row for the HBM-PS, the MEM-PS drops its
copy (it gets the row back, dirty, when the key leaves the HBM-PS), so DRAM never holds a row twice
on ``--device cpu`` and the MEM-PS budget goes to rows that are not resident. The fetch is a
``MemPS.take``, in ``prepare``, in batch order, so the MEM-PS's content stays independent of timing:
a cached row moves out, a row not cached is read from the SSD-PS (or born) straight into the fetched
rows and never enters the MEM-PS, so fetching evicts nothing. Until ``place`` the fetched rows are
kept as in flight; ``sync_to_store`` (checkpoints) writes resident and in-flight rows through to the
SSD-PS without touching the MEM-PS's content.

Residency is decided in batch order by the prepare stage, deterministically (whatever the timing):
batch ``i`` marks the keys it needs resident with ``last_use = i``; keys whose ``last_use <= i -
window`` are evicted (owners write them back to MEM-PS, every holder erases them from HBM).
``prepare(i)`` runs only once ``train(i - window)`` has finished (:meth:`wait_ready`, the prepare
stage's gate), so an evicted key is final and a key fetched from MEM-PS/SSD-PS is fresh: it was not
resident, so nobody holds a newer copy.

Which keys a rank holds is the sparse-sync strategy's choice (``_sync``): with ``owner`` a rank
holds only keys it owns (the union of what any rank's batch asks of it), so every resident row is
fetched from the local MEM-PS and written back there; with ``allreduce`` every rank holds the whole
global batch's working set and applies every update, so replicas stay bit-identical and the owner
already holds the final row. Either way no rows travel back to owners.

Thread safety: ``prepare`` is called by one thread, ``place`` by one thread, the train thread uses
``hbm`` and calls ``mark_trained``; ``sync_to_store`` (checkpoints, from the train thread),
``drop_all`` and ``read_owned`` hold the residency lock, which ``prepare`` holds for its whole call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from .._index import KeyIndex
from ..errors import InternalError
from ..gpu import PartitionedHashTable
from ..table import HashTable

#: The residency window of a training job: prepare(i) waits for train(i - WINDOW); keys unused for
#: WINDOW batches leave the HBM-PS.
WINDOW = 3


@dataclass
class Prepared:
    """What prepare hands to place: the rows to insert into HBM for batch ``index``."""

    index: int
    fetch_keys: np.ndarray      # (f,) uint64, keys not resident before this batch
    fetch_rows: np.ndarray      # (f, row_width)


class ParameterHierarchy:
    """One process's view of the three tiers. ``hbm``: HashTable-like; ``memps``: hps.mem.MemPS of the
    keys this rank owns; ``owned_mask(keys) -> (n,) bool``: which keys this rank owns;
    ``pull(keys, serve) -> rows``: rows of resident-to-be keys that may belong to other ranks, each
    owner serving its own with ``serve`` (collective; None when every key a rank holds is its own).
    ``grow(capacity, reserve)``: grows the HBM-PS by calling ``reserve(capacity)``, charging it to a
    memory budget first (``_budget.TwinBudget``; None: ``hbm.reserve`` alone)."""

    def __init__(self, hbm, memps, window: int, owned_mask, pull=None, grow=None):
        self.hbm = hbm
        self.memps = memps
        self.grow = grow or (lambda capacity, reserve: reserve(capacity))
        self.owned_mask = owned_mask
        self.pull = pull
        self.window = int(window)
        self._last_use = KeyIndex(width=1)
        self._working_sets: dict[int, np.ndarray] = {}  # batch index -> its working set, while in window
        self._in_flight: dict[int, tuple] = {}  # batch index -> (keys, rows) prepared, not placed yet
        self._lock = threading.RLock()
        self._trained = threading.Condition()
        self._trained_upto = -1
        self._abort = False

    # -- train-stage side --------------------------------------------------------------------------
    def mark_trained(self, index: int) -> None:
        with self._trained:
            self._trained_upto = index
            self._trained.notify_all()

    def abort(self) -> None:
        """Wake a prepare that waits for training (the pipeline is stopping)."""
        with self._trained:
            self._abort = True
            self._trained.notify_all()

    def wait_ready(self, index: int, stop: threading.Event | None = None) -> None:
        """Block until batch ``index`` may be prepared (``train(index - window)`` finished), or
        ``stop`` is set, or :meth:`abort` was called."""
        with self._trained:
            index -= self.window
            while self._trained_upto < index and not self._abort and not (stop and stop.is_set()):
                self._trained.wait(timeout=0.1)

    # -- prepare stage -------------------------------------------------------------------------------
    def prepare(self, index: int, working_set: np.ndarray) -> Prepared:
        """Make the keys batch ``index`` needs on this rank (unique uint64) resident: evict what fell
        out of the window, then fetch the keys that are not resident.
        REQUIRES: ``wait_ready(index)`` returned (the pipeline's gate of the prepare stage)."""
        with self._lock:
            self._evict_older_than(index - self.window)
            found = self._last_use.contains(working_set)
            fetch = working_set[~found]
            self._last_use.assign(working_set, np.full(working_set.shape[0], index, np.int64))
            self._working_sets[index] = working_set
            rows = self._fetch(fetch)     # exclusive tiers: the owned rows leave the MEM-PS (take)
            self._in_flight[index] = (fetch, rows)
        return Prepared(index, fetch, rows)

    def _fetch(self, keys: np.ndarray) -> np.ndarray:
        """Rows of non-resident keys: own keys from MEM-PS (pin dropped at once: HBM is the holder
        now), the others from their owners. REQUIRES: lock held."""
        return self._serve(keys) if self.pull is None else self.pull(keys, self._serve)

    def _serve(self, keys: np.ndarray) -> np.ndarray:
        """Rows of owned, non-resident, distinct ``keys``, taken out of the MEM-PS (else read from the
        SSD-PS or born): the HBM-PS holds them from now on and pushes them back when they leave it,
        so DRAM never holds a row twice; nothing is inserted into the MEM-PS, so nothing is evicted."""
        return self.memps.take(keys)

    def _evict_older_than(self, limit: int) -> None:
        """Write back and drop resident keys with ``last_use <= limit``. Earlier calls evicted up to
        ``limit - 1``, so those are the keys of batch ``limit`` not used since: O(working set), not
        O(resident). REQUIRES: lock held."""
        old = self._working_sets.pop(limit, None)
        if old is None:
            return
        last, _ = self._last_use.lookup(old)
        old = old[last[:, 0] == limit]
        if old.shape[0]:
            self._write_back(old)
            self.hbm.erase(old)
            self._last_use.erase(old)

    def _write_back(self, keys: np.ndarray) -> None:
        """Push the HBM rows of the keys this rank owns into its MEM-PS (they leave the HBM-PS).
        REQUIRES: lock held."""
        mine = keys[self.owned_mask(keys)]
        if mine.shape[0]:
            rows, found = self.hbm.get(mine)
            if not found.all():
                raise InternalError(f"{int((~found).sum())} resident keys of trained batches are missing "
                                    "from HBM-PS (residency bug)")
            self.memps.push(mine, _host(rows), unpin=False)

    def _store_resident(self, keys: np.ndarray, in_flight) -> None:
        """Write the current rows of the resident ``keys`` this rank owns through to the SSD-PS, the
        HBM-PS staying their holder: placed ones from the HBM-PS, those of ``in_flight`` batches
        (``(keys, rows)`` prepared but not placed when the caller looked; not trained yet, so the
        fetched rows are current) from there. ``place`` inserts, then forgets the batch, so a batch
        missing from ``in_flight`` is in the HBM-PS before this reads it. REQUIRES: lock held."""
        mine = keys[self.owned_mask(keys)]
        if mine.shape[0]:
            rows, found = self.hbm.get(mine)
            self.memps.write_through(mine[found], _host(rows)[found])
        for fk, rows in in_flight:
            own = self.owned_mask(fk)
            if own.any():
                self.memps.write_through(fk[own], rows[own])

    # -- place stage -------------------------------------------------------------------------------------
    def place(self, prep: Prepared) -> None:
        """Insert the fetched rows into HBM-PS (blocks until done), first growing the table (to at least
        twice its capacity, on its device, keeping every entry) when they might not fit: the working
        set of a later batch may be larger than the first one's, which sized the table."""
        n = prep.fetch_keys.shape[0]
        if n:
            need = len(self.hbm) + n  # erases of a concurrent prepare only lower the true need
            if need > self.hbm.capacity:
                self.grow(max(need, 2 * self.hbm.capacity), self.hbm.reserve)
            self.hbm.insert(prep.fetch_keys, prep.fetch_rows)
        self._in_flight.pop(prep.index, None)

    # -- consistent cuts ---------------------------------------------------------------------------------
    def sync_to_store(self) -> None:
        """Write every resident row this rank owns through to the SSD-PS and flush the MEM-PS, so the
        store alone holds every owned row as of the last trained batch; the MEM-PS's content does
        not change (tiers stay exclusive). Call between batches (the train stage is idle); holds
        the residency lock so prepare cannot run meanwhile."""
        with self._lock:
            keys, _ = self._last_use.items()
            if keys.shape[0]:
                self._store_resident(keys, list(self._in_flight.values()))
            self.memps.flush()

    def drop_all(self) -> None:
        """Write back and forget every resident key (end of training)."""
        with self._lock:
            keys, _ = self._last_use.items()
            if keys.shape[0]:
                self._write_back(keys)
                self.hbm.erase(keys)
            self._last_use.clear()
            self._working_sets.clear()
            self._in_flight.clear()
            self.memps.flush()

    def read_owned(self, keys: np.ndarray) -> np.ndarray:
        """Current rows of owned ``keys`` (n,) -> (n, row_width): resident ones from HBM, the others
        from MEM-PS/SSD-PS (or the initializer), read only: nothing is cached or pinned, so an
        evaluation leaves the tiers as they were (also during training). Holds the residency lock."""
        with self._lock:
            rows = np.empty((keys.shape[0], self.memps.row_width), self.memps.dtype)
            res = self._last_use.contains(keys)
            if res.any():
                # ``place`` inserts, then forgets the batch: a key missing from the HBM-PS after this
                # snapshot is in the snapshot (prepared, not placed; the MEM-PS handed it over)
                in_flight = list(self._in_flight.values())
                got, found = self.hbm.get(keys[res])
                found = np.asarray(_host(found), dtype=bool)
                where = np.flatnonzero(res)
                rows[where[found]] = _host(got)[found]
                if not found.all():
                    rows[where[~found]] = _rows_of(keys[where[~found]], in_flight)
            rows[~res] = self.memps.read(keys[~res])
            return rows

    def delete(self, keys: np.ndarray) -> int:
        """Delete owned ``keys`` (n,) uint64 from every tier (feature expiry): MEM-PS and SSD-PS; a
        key that is not resident is in no HBM-PS. A deleted key that comes back is born again from
        the initializer -> keys the SSD-PS held. Holds the residency lock. REQUIRES: no key is
        resident (expiry deletes only keys unused for longer than the residency window); raises
        InternalError, deleting nothing, otherwise."""
        with self._lock:
            res = self._last_use.contains(keys)
            if res.any():
                raise InternalError(f"{int(res.sum())} keys to delete are resident (expiry bug)")
            return self.memps.delete(keys)

    def update_owned(self, keys: np.ndarray, update) -> np.ndarray:
        """Apply ``update(sel, rows) -> new rows`` to the current rows of owned, unique ``keys`` (n,)
        wherever they are (``sel`` indexes ``keys``): resident rows placed in HBM-PS there, rows that
        are not resident in MEM-PS (SSD-PS, initializer). Rows resident for a batch prepared but not
        placed yet are left alone -> done (n,) bool, False for those. Holds the residency lock
        (``--consistency het``: pushes of rows no batch in flight holds)."""
        done = np.ones(keys.shape[0], np.bool_)
        with self._lock:
            res = self._last_use.contains(keys)
            at = np.flatnonzero(res)
            if at.shape[0]:
                rows, found = self.hbm.get(keys[at])
                rows, hit = _host(rows), at[found]
                if hit.shape[0]:
                    self.hbm.insert(keys[hit], update(hit, rows[found]))
                done[at[~found]] = False
            out = np.flatnonzero(~res)
            chunk = max(1, self.memps.cache.capacity_rows // 2)
            for a in range(0, out.shape[0], chunk):  # O(keys / budget) calls, never one per key
                sel = out[a:a + chunk]
                self.memps.push(keys[sel], update(sel, self.memps.pull(keys[sel])))
        return done

    @property
    def resident(self) -> int:
        return len(self._last_use)


def _host(a):
    """Host NumPy view/copy of a NumPy, CuPy or Numba device array. Blocking."""
    if hasattr(a, "get") and type(a).__module__.startswith("cupy"):
        return a.get()
    if hasattr(a, "__cuda_array_interface__"):
        from numba import cuda

        return cuda.as_cuda_array(a).copy_to_host()
    return a


def make_hbm(capacity: int, row_width: int, device: str, n_parts: int, gpus: int | None = None):
    if n_parts > 1:
        return PartitionedHashTable(n_parts, capacity, row_width, device=device, gpus=gpus)
    return HashTable(capacity, row_width, device=device)


def _rows_of(keys: np.ndarray, in_flight: list) -> np.ndarray:
    """Rows of ``keys`` (n,) uint64 from ``in_flight`` (``(keys, rows)`` pairs of batches prepared but
    not placed: their key sets are disjoint) -> (n, row_width). Raises InternalError when one is
    missing (residency bug)."""
    have = np.concatenate([k for k, _ in in_flight]) if in_flight else np.empty(0, np.uint64)
    order = np.argsort(have, kind="stable")
    at = np.searchsorted(have, keys, sorter=order)
    at = np.minimum(at, max(have.shape[0] - 1, 0))
    if have.shape[0] == 0 or not (have[order[at]] == keys).all():
        raise InternalError("resident keys are neither in the HBM-PS nor in flight to it (residency bug)")
    return np.concatenate([r for _, r in in_flight])[order[at]]
