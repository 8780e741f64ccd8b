"""``ParameterHierarchy``: HBM-PS over MEM-PS over SSD-PS for one process (Algorithm 1 of ``seeds/004``).

Rows (embedding | optimizer state) are authoritative in exactly one place at a time:

- a **resident** key is in the HBM-PS table, which only the train stage's kernels change (and the
  prepare stage's inserts and evictions, of keys no batch in flight uses);
- every other key lives in the MEM-PS cache of its owner rank or, evicted from there, in its SSD-PS.

The HBM-PS is a cache across batches (seed 004, Section 4.2; the policy is the table's slot score,
``hps/table/_cache.py``): a key stays resident after its batch, and a later batch that uses it finds
it there and costs the host nothing but the residency lookup. Only when a batch's misses would take
the table past ``budget_rows`` (``--hbm-budget``) do resident rows leave, the coldest by the table's
score (LRU+LFU, evaluated on the table's device) among the keys no batch in flight uses, in one
batched call whose rows the owner writes back to its MEM-PS (``evict``). A batch's working set larger
than a budget the user gave is a :class:`~hps.errors.CacheBudgetError` naming both sizes; the default
budget of the CPU twin (the twin's share of the host budget) rises with the largest working set so
far when that needs more (``budget_for``).

The tiers are exclusive: a fetch is a ``MemPS.take`` (the MEM-PS drops its copy and gets the row back,
dirty, when the key leaves the HBM-PS), so DRAM never holds a row twice on ``--device cpu``.

Residency is decided in batch order by the prepare stage, deterministically (whatever the timing), and
lives in the table alone: ``prepare(i)`` looks the working set up (each resident key counts a use in
batch ``i``), evicts what must leave, fetches the misses from the MEM-PS/SSD-PS (or their owners) and
inserts them (counting their first use), all under the residency lock. ``prepare(i)`` runs only once
``train(i - window)`` has finished (:meth:`wait_ready`, the prepare stage's gate), so the keys looked
up in batch ``i - window + 1`` or later are those of the batches in flight, which are never evicted,
and an evicted row is final. When those batches alone leave too little room, prepare waits for
``train(i - 1)`` and evicts among every key but batch ``i``'s. The table's content and scores depend
only on the batches' order, so the CPU twin and the GPU table hold and evict the same keys.

Which keys a rank holds is the sparse-sync strategy's choice (``_sync``): with ``owner`` a rank
holds only keys it owns, fetched from and written back to its own MEM-PS; with ``allreduce`` every rank
holds the whole global batch's working set (identical tables on every rank, so identical evictions;
a rank writes back only the victims it owns: the replicas are bit-identical).

Thread safety: ``prepare`` is called by one thread; the train thread uses ``hbm`` and calls
``mark_trained``; ``sync_to_store`` (checkpoints, from the train thread), ``drop_all``, ``read_owned``,
``update_owned``, ``owned_rows`` and ``delete`` hold the residency lock, which ``prepare`` holds while it changes the
table (not while it waits for training). The train step's row access (``find_rows``/``write_rows`` of
the batches in flight) takes neither lock on the CPU twin, only its row lock (``hps/table/_rows.py``), so
it goes on while prepare looks up, evicts (the sink pushes to the MEM-PS) and fetches: the victims and
the fetched keys are never keys of batches in flight, so the rows the step reads and writes and those
prepare reads and writes are disjoint, and a victim's row is final when the sink reads it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ..errors import CacheBudgetError, HashTableFullError, InternalError
from ..gpu import PartitionedHashTable
from ..table import BATCH_LIMIT, HashTable
from ._hbm_budget import table_keys

#: The residency window of a training job: prepare(i) waits for train(i - WINDOW); the keys of the
#: WINDOW batches up to i are never evicted.
WINDOW = 3


@dataclass
class Prepared:
    """What prepare did for batch ``index``: ``fetched`` rows entered the HBM-PS, ``evicted`` left it."""

    index: int
    fetched: int
    evicted: int = 0


class ParameterHierarchy:
    """One process's view of the three tiers. ``hbm``: HashTable-like with the cache operations
    ``missing`` / ``lookup`` / ``evict`` and, on the CPU twin, ``insert_new`` (``hps/table/_cache.py``);
    ``memps``: hps.mem.MemPS of the keys this rank
    owns; ``owned_mask(keys) -> (n,) bool``: which keys this rank owns; ``pull(keys, serve) -> rows``:
    rows of resident-to-be keys that may belong to other ranks, each owner serving its own with
    ``serve`` (collective; None when every key a rank holds is its own); ``budget_rows``: the rows the
    HBM-PS may hold (``--hbm-budget``; None: unbounded); ``budget_for(n) -> rows``: the budget a
    batch of ``n`` keys calls for when the budget follows the working sets (the floor of the default
    on the CPU: ``_hbm_budget.working_set_budget_rows``; it only rises), None when it is fixed;
    ``grow(capacity, reserve)``: grows the HBM-PS by calling ``reserve(capacity)``, charging it to a
    memory budget first (``_budget.TwinBudget``; None: ``hbm.reserve`` alone)."""

    def __init__(self, hbm, memps, window: int, owned_mask, pull=None, budget_rows: int | None = None,
                 grow=None, budget_for=None):
        self.hbm = hbm
        self.memps = memps
        self.grow = grow or (lambda capacity, reserve: reserve(capacity))
        self.owned_mask = owned_mask
        self.pull = pull
        self.window = int(window)
        self.budget_rows = budget_rows
        self.budget_for = budget_for
        self.evicted = 0       # rows that left the HBM-PS for the budget
        self.fetched = 0       # rows that entered it
        self.born = 0          # of them, rows of keys new to every tier made on the device (a GPU HBM-PS)
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

    def wait_ready(self, index: int, stop: threading.Event | None = None) -> bool:
        """Block until batch ``index`` may be prepared (``train(index - window)`` finished), or
        ``stop`` is set, or :meth:`abort` was called -> whether that batch was trained."""
        return self._wait_trained(index - self.window, stop)

    def _wait_trained(self, index: int, stop=None) -> bool:
        with self._trained:
            while self._trained_upto < index and not self._abort and not (stop and stop.is_set()):
                self._trained.wait(timeout=0.1)
            return self._trained_upto >= index

    # -- prepare stage -------------------------------------------------------------------------------
    def prepare(self, index: int, working_set: np.ndarray) -> Prepared:
        """Make the keys batch ``index`` needs on this rank (unique uint64: host, or already on the
        device, ``_device_batch.DeviceKeys``, which ``hbm.missing`` takes as they are) resident: look
        them up (a use of each resident one), evict for the misses if the budget needs it, fetch and
        insert the misses. REQUIRES: ``wait_ready(index)`` returned (the prepare stage's gate)."""
        n, row_bytes = working_set.shape[0], self.memps.row_width * self.memps.dtype.itemsize
        if self.budget_for is not None and self.budget_rows is not None:  # a bigger batch than any before
            self.budget_rows = max(self.budget_rows, self.budget_for(n))
        if self.budget_rows is not None and n > self.budget_rows:
            raise CacheBudgetError(
                f"batch {index} has a working set of {n:,} rows on this rank ({n * row_bytes:,} bytes of rows), "
                f"more than the HBM-PS budget of {self.budget_rows:,} rows (--hbm-budget): raise --hbm-budget "
                "or lower --batch-size")
        evicted = self.evicted
        with self._lock:
            miss = np.asarray(_host(self.hbm.missing(working_set, index)))
            short = self._make_room(miss.shape[0], index - self.window + 1)
        if short:  # the batches in flight hold the room: wait until they are trained
            if not self._wait_trained(index - 1):
                raise InternalError(f"batch {index}: the pipeline stopped while prepare waited for HBM-PS room")
            with self._lock:
                if self._make_room(miss.shape[0], index):
                    raise InternalError(f"batch {index}: no HBM-PS room although its working set fits the budget")
        with self._lock:
            self._admit(miss, index)     # exclusive tiers: the owned rows leave the MEM-PS (take)
            self.fetched += miss.shape[0]
        return Prepared(index, int(miss.shape[0]), self.evicted - evicted)

    def _make_room(self, n_new: int, protect_from: int) -> int:
        """Evict so that ``n_new`` more keys stay within the budget, never a key looked up in batch
        ``protect_from`` or later -> rows still missing (0: done). REQUIRES: lock held."""
        if self.budget_rows is None:
            return 0
        over = len(self.hbm) + n_new - self.budget_rows
        if over <= 0:
            return 0
        gone = self._evict(over, max(0, protect_from))
        self.evicted += gone
        return over - gone

    def _evict(self, n: int, protect_from: int) -> int:
        """Evict up to ``n`` rows, none looked up in batch ``protect_from`` or later, and write the
        owned ones back (:meth:`_write_back`) -> rows evicted. The CPU twin hands its slot array and
        the victims' slots over (``evict_into``: no row is gathered or copied on the way; the train
        step's row access goes on meanwhile). REQUIRES: lock held."""
        into = getattr(self.hbm, "evict_into", None)
        if into is not None:
            return into(n, protect_from, self._write_back).shape[0]
        keys, rows = self.hbm.evict(n, protect_from)
        self._write_back(keys, _host(rows))
        return keys.shape[0]

    def _write_back(self, keys: np.ndarray, rows: np.ndarray, at: np.ndarray | None = None) -> None:
        """The owner takes the rows of evicted ``keys`` (k,) (distinct, host; the row of ``keys[i]`` is
        ``rows[at[i]]``, ``at`` None: ``rows[i]``) back into its MEM-PS, dirty (``absent``: the tiers
        are exclusive, no owned resident key is cached there); replicas are dropped (bit-identical). No
        row is copied on the way (a rank that owns only some selects them through ``at``). REQUIRES:
        lock held."""
        if not keys.shape[0]:
            return
        mine = self.owned_mask(keys)
        if mine.all():
            self.memps.push(keys, _host(rows), unpin=False, distinct=True, at=at, absent=True)
        elif mine.any():
            if at is None:
                at = np.arange(keys.shape[0], dtype=np.int64)
            self.memps.push(keys[mine], _host(rows), unpin=False, distinct=True, at=at[mine], absent=True)

    def _admit(self, keys: np.ndarray, index: int) -> None:
        """Fetch the rows of the non-resident ``keys`` and insert them, each counting its first use in
        batch ``index``, first growing the table (to at least twice its capacity, up to the budget, on
        its device) when they might not fit. When every key is this rank's own and the table has
        ``insert_new`` (one table, not parts), the MEM-PS writes the rows straight into the slots the
        keys claim (``MemPS.take`` into the CPU twin's slot array: no row is copied, no array allocated
        per batch); otherwise (rows pulled from their owners, parts, a GPU table) they come through a
        host array (``insert``, then ``missing`` counts the use) -- but for the rows of keys new to every
        tier, which a GPU table with ``births`` makes on the device (``insert_born``). REQUIRES: lock held."""
        n = keys.shape[0]
        if not n:
            return
        need = len(self.hbm) + n
        if need > self.hbm.capacity:
            self._grow(need)
        insert_new = getattr(self.hbm, "insert_new", None) if self.pull is None else None
        if insert_new is None:
            if self.pull is None and getattr(self.hbm, "births", False):  # new keys' rows made on the GPU
                rows, born = self.memps.take(keys, leave_born=True)
                self._retry(lambda: self.hbm.insert_born(keys, rows, born, self.memps.initializer))
                self.born += int(np.count_nonzero(born))
            else:
                rows = self._fetch(keys)
                self._retry(lambda: self.hbm.insert(keys, rows))
            if np.asarray(_host(self.hbm.missing(keys, index))).shape[0]:  # their first use
                raise InternalError(f"batch {index}: keys inserted into the HBM-PS are missing from it")
            return
        before = len(self.hbm)
        self._retry(lambda: insert_new(keys, lambda out, at: self.memps.take(keys, out, at), index))
        if len(self.hbm) != before + n:
            raise InternalError(f"batch {index}: keys inserted into the HBM-PS are missing from it "
                                f"({len(self.hbm) - before} of {n} entered it)")

    def _retry(self, insert) -> None:
        """``insert()``, again after growing when a part's share is full although the whole fits."""
        try:
            insert()
        except HashTableFullError:
            self._grow(2 * self.hbm.capacity, cap=False)
            insert()

    def _grow(self, need: int, cap: bool = True) -> None:
        """Grow the table to at least ``need`` keys: twice its capacity, rounded up to what the slot
        array it takes holds (a table asked for 3.3 M keys takes 8.4 M slots, which hold 4.2 M: asked
        for less, it would grow again into 16.8 M slots at 3.3 M keys), up to the budget (``cap``)."""
        grow = table_keys(max(need, 2 * self.hbm.capacity))
        if cap and self.budget_rows is not None:
            grow = max(need, min(grow, self.budget_rows))
        self.grow(grow, self.hbm.reserve)

    def _fetch(self, keys: np.ndarray) -> np.ndarray:
        """Rows of non-resident keys: own keys from MEM-PS (taken: HBM is their holder now), the
        others from their owners. REQUIRES: lock held."""
        return self._serve(keys) if self.pull is None else self.pull(keys, self._serve)

    def _serve(self, keys: np.ndarray) -> np.ndarray:
        """Rows of owned, non-resident, distinct ``keys``, taken out of the MEM-PS (else read from the
        SSD-PS or born): the HBM-PS holds them from now on and pushes them back when they leave it,
        so DRAM never holds a row twice; nothing is inserted into the MEM-PS, so nothing is evicted."""
        return self.memps.take(keys)

    # -- consistent cuts ---------------------------------------------------------------------------------
    def sync_to_store(self) -> None:
        """Write every resident row this rank owns through to the SSD-PS and flush the MEM-PS, so the
        store alone holds every owned row as of the last trained batch; the MEM-PS's content and the
        HBM-PS's do not change. Call between batches (the train stage is idle); holds the residency lock
        so prepare cannot change the table meanwhile. DRAM: one copy of the resident rows (the table's
        export), written in key order (the tiers below then hold them in an order that does not depend
        on the table's layout or its device's threads) a :meth:`_step` at a time."""
        with self._lock:
            keys, rows = self.hbm.export()
            rows = _host(rows)
            order, step = np.argsort(keys, kind="stable"), self._step()   # the cache's size changes meanwhile
            for a in range(0, order.shape[0], step):   # O(rows / step) calls
                sel = order[a:a + step]
                mine = sel[self.owned_mask(keys[sel])]
                if mine.shape[0]:
                    self.memps.write_through(keys[mine], rows[mine])
            self.memps.flush()

    def _step(self) -> int:
        """Rows written down to the MEM-PS per call when the whole HBM-PS goes down."""
        return max(1024, self.memps.cache.capacity_rows // 4)

    def drop_all(self) -> None:
        """Write back and forget every resident key (end of training), a :meth:`_step` of rows at a
        time but in at most 8 steps (each ``hbm.evict`` ranks every live key), the coldest first
        (keys in key order within a step), so the rows never stand twice in DRAM."""
        with self._lock:
            step = max(self._step(), -(-len(self.hbm) // 8))
            while len(self.hbm):
                if not self._evict(step, BATCH_LIMIT - 1):  # no key is protected
                    raise InternalError(f"{len(self.hbm)} resident keys could not be evicted at the end")
            self.hbm.clear()   # its tombstones
            self.memps.flush()

    def read_owned(self, keys: np.ndarray) -> np.ndarray:
        """Current rows of owned ``keys`` (n,) -> (n, row_width): resident ones from HBM, the others
        from MEM-PS/SSD-PS (or the initializer), read only: nothing is cached or pinned, so an
        evaluation leaves the tiers as they were (also during training). Holds the residency lock."""
        with self._lock:
            rows = np.empty((keys.shape[0], self.memps.row_width), self.memps.dtype)
            if not keys.shape[0] or not len(self.hbm):  # nothing resident (e.g. after training)
                rows[...] = self.memps.read(keys)
                return rows
            got, found = self.hbm.get(keys)
            found = np.asarray(_host(found), dtype=bool)
            rows[found] = _host(got)[found]
            rows[~found] = self.memps.read(keys[~found])
            return rows

    def delete(self, keys: np.ndarray) -> int:
        """Delete owned ``keys`` (n,) uint64 from every tier (feature expiry): the HBM-PS (a key unused
        for longer than the residency window may still be cached there), MEM-PS and SSD-PS. A deleted
        key that comes back is born again from the initializer -> keys the SSD-PS held. Holds the
        residency lock. REQUIRES: no batch in flight uses them (expiry deletes only keys unused for
        longer than the residency window); with ``allreduce`` every rank deletes the same keys. The
        lower tiers first: when they fail (the SSD-PS's disk full), the HBM-PS keeps its rows."""
        with self._lock:
            n = self.memps.delete(keys)
            if keys.shape[0]:
                self.hbm.erase(keys)
            return n

    def update_owned(self, keys: np.ndarray, update) -> np.ndarray:
        """Apply ``update(sel, rows) -> new rows`` to the current rows of owned, unique ``keys`` (n,)
        wherever they are (``sel`` indexes ``keys``): resident rows in the HBM-PS, the others in the
        MEM-PS (SSD-PS, initializer) -> done (n,) bool (every one: the HBM-PS holds a resident row from
        the prepare that fetched it). Holds the residency lock (``--consistency het``)."""
        done = np.ones(keys.shape[0], np.bool_)
        with self._lock:
            if not keys.shape[0]:
                return done
            rows, found = self.hbm.get(keys)
            found = np.asarray(_host(found), dtype=bool)
            hit = np.flatnonzero(found)
            if hit.shape[0]:
                self.hbm.insert(keys[hit], update(hit, _host(rows)[found]))
            out = np.flatnonzero(~found)
            chunk = max(1, self.memps.cache.capacity_rows // 2)
            for a in range(0, out.shape[0], chunk):  # O(keys / budget) calls, never one per key
                sel = out[a:a + chunk]
                self.memps.push(keys[sel], update(sel, self.memps.pull(keys[sel])))
        return done

    def owned_rows(self) -> int:
        """The rows this rank owns over the three tiers: the SSD-PS's after :meth:`drop_all`, counted
        without writing a row (``MemPS.rows_after_flush`` of the resident keys it owns). Holds the
        residency lock."""
        with self._lock:
            keys = np.asarray(_host(self.hbm.live_keys())) if len(self.hbm) else np.empty(0, np.uint64)
            return self.memps.rows_after_flush(keys[self.owned_mask(keys)])

    @property
    def resident(self) -> int:
        return len(self.hbm)


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
