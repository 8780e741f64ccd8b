"""``ParameterHierarchy``: HBM-PS over MEM-PS over SSD-PS for one process (Algorithm 1 of ``seeds/004``).

Rows (embedding | optimizer state) are authoritative in exactly one place at a time:

- a key of an in-flight batch is **resident** in the HBM-PS table and only the train stage changes it;
- every other key lives in the MEM-PS cache of its owner rank or, evicted from there, in its SSD-PS.

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
from ..errors import CacheBudgetError, InternalError
from ..table import HashTable


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
    owner serving its own with ``serve`` (collective; None when every key a rank holds is its own)."""

    def __init__(self, hbm, memps, window: int, owned_mask, pull=None):
        self.hbm = hbm
        self.memps = memps
        self.owned_mask = owned_mask
        self.pull = pull
        self.window = int(window)
        self._last_use = KeyIndex(width=1)
        self._working_sets: dict[int, np.ndarray] = {}  # batch index -> its working set, while in window
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
        owned = int(self.owned_mask(working_set).sum())
        if owned > self.memps.cache.capacity_rows:
            raise CacheBudgetError(
                f"batch {index} has a working set of {owned} rows on this rank "
                f"({owned * self.memps.row_width * self.memps.dtype.itemsize} bytes), more than "
                f"the MEM-PS budget of {self.memps.cache.capacity_rows} rows "
                f"({self.memps.cache.budget_bytes} bytes): raise --mem-budget or lower --batch-size")
        with self._lock:
            self._evict_older_than(index - self.window)
            found = self._last_use.contains(working_set)
            fetch = working_set[~found]
            self._last_use.assign(working_set, np.full(working_set.shape[0], index, np.int64))
            self._working_sets[index] = working_set
            rows = self._fetch(fetch)
        return Prepared(index, fetch, rows)

    def _fetch(self, keys: np.ndarray) -> np.ndarray:
        """Rows of non-resident keys: own keys from MEM-PS (pin dropped at once: HBM is the holder
        now), the others from their owners. REQUIRES: lock held."""
        return self._serve(keys) if self.pull is None else self.pull(keys, self._serve)

    def _serve(self, keys: np.ndarray) -> np.ndarray:
        """Rows of owned, non-resident ``keys`` from MEM-PS (SSD-PS, initializer), unpinned."""
        chunk = max(1, self.memps.cache.capacity_rows // 2)
        out = np.empty((keys.shape[0], self.memps.row_width), self.memps.dtype)
        for a in range(0, keys.shape[0], chunk):  # O(keys / budget) calls, never one per key
            out[a:a + chunk] = self.memps.pull(keys[a:a + chunk])
            self.memps.unpin(keys[a:a + chunk])
        return out

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

    def _write_back(self, keys: np.ndarray, placed_only: bool = False) -> None:
        """Push the HBM rows of the keys this rank owns into its MEM-PS. With ``placed_only``, skip
        keys of batches prepared but not placed yet (their MEM-PS row is still the current one).
        REQUIRES: lock held."""
        mine = keys[self.owned_mask(keys)]
        if mine.shape[0]:
            rows, found = self.hbm.get(mine)
            rows = _host(rows)
            if placed_only:
                mine, rows = mine[found], rows[found]
            elif not found.all():
                raise InternalError(f"{int((~found).sum())} resident keys of trained batches are missing "
                                    "from HBM-PS (residency bug)")
            self.memps.push(mine, rows, unpin=False)

    # -- place stage -------------------------------------------------------------------------------------
    def place(self, prep: Prepared) -> None:
        """Insert the fetched rows into HBM-PS (blocks until done)."""
        if prep.fetch_keys.shape[0]:
            self.hbm.insert(prep.fetch_keys, prep.fetch_rows)

    # -- consistent cuts ---------------------------------------------------------------------------------
    def sync_to_store(self) -> None:
        """Copy every resident row this rank owns into MEM-PS and flush MEM-PS to SSD-PS, so the
        store alone holds every owned row as of the last trained batch. Call between batches
        (the train stage is idle); holds the residency lock so prepare cannot run meanwhile."""
        with self._lock:
            keys, _ = self._last_use.items()
            if keys.shape[0]:
                self._write_back(keys, placed_only=True)
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
            self.memps.flush()

    def read_owned(self, keys: np.ndarray) -> np.ndarray:
        """Current rows of owned ``keys`` (n,) -> (n, row_width): resident ones from HBM, the others
        from MEM-PS (also the keys of a batch prepared but not placed yet). Read-only (evaluation, and
        FAE's held-out loss during training). Holds the residency lock."""
        with self._lock:
            rows = np.empty((keys.shape[0], self.memps.row_width), self.memps.dtype)
            res = self._last_use.contains(keys)
            if res.any():
                idx = np.flatnonzero(res)
                got, found = self.hbm.get(keys[idx])
                found = np.asarray(_host(found), np.bool_)
                rows[idx[found]] = _host(got)[found]
                res[idx[~found]] = False  # prepared, not placed yet: MEM-PS still holds the current row
            rows[~res] = self._serve(keys[~res])
            return rows

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


def make_hbm(capacity: int, row_width: int, device: str, n_parts: int):
    if n_parts > 1:
        from ..gpu import PartitionedHashTable

        return PartitionedHashTable(n_parts, capacity, row_width, device=device)
    return HashTable(capacity, row_width, device=device)
