"""HET (seed 001, §3-4): per-rank caches of rows owned by other ranks, kept consistent by
per-embedding Lamport clocks within a staleness bound ``s`` (``--consistency het``).

The protocol, rank side (:class:`HetCache`) and owner side (:class:`HetOwner`); the MPI exchange
that carries it in the trainer is ``_het_sync.HetSync``. Both sides are local objects (no
communication), so ``tests/test_het_protocol.py`` drives them for simulated ranks in one process
against the slow serial reference ``tests/reference/het.py``.

Clocks (§3.1). The owner keeps ``c_g`` per owned key, the global clock; a cached copy keeps its start
clock ``c_s`` (``c_g`` when fetched) and current clock ``c_c`` (+1 per local write).

One global mini-batch on rank r (Algorithm 1; its keys were sent to their owners in the prepare stage):

1. **clock reply.** Every owner sends the ``c_g`` of every key a rank asked for (4 bytes a key, the
   layout of the rows BSP would send): this is how a rank learns ``c_g`` cheaply.
2. **Read** (Algorithm 2, :meth:`HetCache.read`). ``CheckValid``: ``c_c <= c_s + s`` and
   ``c_c >= c_g - s``. A valid entry is a hit; an invalid one is removed and its accumulated
   gradient and ``c_c`` pushed (``Evict(k)``); a miss or an invalid entry is fetched. The owner applies
   the invalidation pushes before it serves any row (``Evict`` before ``Fetch``), and sends each
   fetched row with its ``c_g`` after them, which becomes the new entry's ``c_s = c_c``.
3. **Write** (Algorithm 3, :meth:`HetCache.write`). Each cached row takes its gradient locally — the
   row optimizer on the cached row and its cached optimizer state (read-my-updates) — accumulates it
   for the owner, and ``c_c += 1``. Then ``Evict()``: an entry with ``c_c > c_s + s`` can never be
   valid again, so it is pushed and dropped now (eager invalidation: the push Algorithm 2 would make at
   its next read, made at the end of this mini-batch instead), then entries beyond the capacity are
   evicted by the policy (``lfu``: fewest uses, then least recent, then smallest key; ``lru``: least
   recent, then smallest key) and pushed. An eviction never loses a gradient.
4. **Owner.** Pushes of one mini-batch are reduced per key in rank order and applied with one
   optimizer step per key (as BSP sums the gradients of a mini-batch); ``c_g = max(c_g, pushed c_c)``.

Keys a rank owns are never cached: it reads the owner's row every mini-batch and pushes every write
at once (a replica with ``s = 0`` that costs no traffic). With ``s = 0`` every entry is pushed at the
end of the mini-batch that fetched it, so the caches are empty between mini-batches and training is
exactly BSP. A push for a row its owner cannot update now (resident for a batch prepared ahead, not
yet placed in HBM-PS) waits in the owner's pending table, summed, and is applied before the row is
served or checkpointed (:meth:`HetOwner.apply_pending`); no observer sees the difference except
that two such pushes take one optimizer step.

Not thread-safe: the train stage alone uses a rank's cache and owner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._index import KeyIndex
from ..comm._kernels import segment_sum
from ..config import HET_POLICIES
from ..errors import InternalError, InvalidInputError
from ..mem import unique_counts

#: Bytes of bookkeeping per cache entry besides its row and gradient: key, c_s, c_c, uses, last use
#: (8 B each) and its key-index slot (about 24 B at the index's load factor).
ENTRY_OVERHEAD_BYTES = 64


def entry_bytes(row_width: int, row_params: int) -> int:
    """DRAM of one cache entry: the row (float32), its accumulated gradient and the bookkeeping."""
    return 4 * (int(row_width) + int(row_params)) + ENTRY_OVERHEAD_BYTES


def cache_entries(spec, row_width: int, row_params: int, table_keys: int | None) -> int:
    """Entries of a ``--het-cache`` of ``spec``: a fraction in [0, 1] of ``table_keys`` (the keys of the
    embedding table; None when unknown) or a size in bytes (int). Raises InvalidInputError."""
    if isinstance(spec, float):
        if table_keys is None:
            raise InvalidInputError(f"--het-cache {spec} is a fraction of the embedding table, whose size is "
                                    "known before training only for synthetic data: give a size such as 64MiB")
        return int(spec * table_keys)
    return int(spec) // entry_bytes(row_width, row_params)


@dataclass
class Pushes:
    """Accumulated gradients on their way to the owners: ``keys`` (n,) uint64, ``clocks`` (n,) int64
    (the pushed ``c_c``), ``grads`` (n, P) float32. Host arrays."""

    keys: np.ndarray
    clocks: np.ndarray
    grads: np.ndarray

    @staticmethod
    def empty(p: int) -> "Pushes":
        return Pushes(np.empty(0, np.uint64), np.empty(0, np.int64), np.empty((0, p), np.float32))

    @staticmethod
    def concat(parts) -> "Pushes":
        return Pushes(np.concatenate([x.keys for x in parts]), np.concatenate([x.clocks for x in parts]),
                      np.concatenate([x.grads for x in parts]))

    def __len__(self) -> int:
        return int(self.keys.shape[0])


class HetCache:
    """One rank's cache of rows owned by other ranks (§3.1). ``capacity`` entries (0 = every entry is
    evicted at the end of the mini-batch that fetched it); rows of ``row_width`` float32 columns whose
    first ``row_params`` the model trains; ``staleness`` s >= 0; ``policy`` lfu | lru; ``opt``: the row
    optimizer applied locally (read-my-updates). While a mini-batch runs the cache may hold more than
    ``capacity`` entries (every key of the mini-batch); ``write`` trims it back."""

    def __init__(self, capacity: int, row_width: int, row_params: int, staleness: int, policy: str, opt):
        if policy not in HET_POLICIES:
            raise InvalidInputError(f"het policy must be one of {', '.join(HET_POLICIES)}; got {policy!r}")
        self.capacity, self.s, self.policy, self.opt = int(capacity), int(staleness), policy, opt
        self.W, self.P = int(row_width), int(row_params)
        self._index = KeyIndex(width=1)
        self._alloc(1024)
        self.tick = 0
        self.stats = {"reads": 0, "hits": 0, "misses": 0, "invalidations": 0, "fetches": 0, "pushes": 0,
                      "evictions": 0}

    def _alloc(self, n: int) -> None:
        self.keys = np.zeros(n, np.uint64)
        self.rows = np.zeros((n, self.W), np.float32)
        self.grad = np.zeros((n, self.P), np.float32)
        self.cs, self.cc, self.uses, self.last = (np.zeros(n, np.int64) for _ in range(4))
        self.used = np.zeros(n, np.bool_)
        self._free = np.arange(n - 1, -1, -1, dtype=np.int64)  # a stack: the lowest slot on top
        self._top = n

    def _grow(self, need: int) -> None:
        n = self.keys.shape[0]
        m = max(2 * n, n + need)
        for name in ("keys", "rows", "grad", "cs", "cc", "uses", "last", "used"):
            old = getattr(self, name)
            new = np.zeros((m,) + old.shape[1:], old.dtype)
            new[:n] = old
            setattr(self, name, new)
        free = np.empty(m, np.int64)  # new slots at the bottom of the stack
        free[:m - n] = np.arange(m - 1, n - 1, -1)
        free[m - n:m - n + self._top] = self._free[:self._top]
        self._free, self._top = free, m - n + self._top

    def __len__(self) -> int:
        return len(self._index)

    # -- Algorithm 2 ---------------------------------------------------------------------------------
    def read(self, keys: np.ndarray, c_g: np.ndarray, remote: np.ndarray):
        """Algorithm 2 for the unique ``keys`` (u,) uint64 of a mini-batch, ``c_g`` (u,) int64 their
        global clocks, ``remote`` (u,) bool the keys other ranks own (the others are never cached).
        -> (slots (u,) int64: the cache slot of each valid hit, else -1; fetch (u,) bool: keys to
        fetch — misses, invalid entries and own keys; Pushes of the invalidated entries)."""
        vals, found = self._index.lookup(keys)
        slots = np.where(found & remote, vals[:, 0], -1)
        hit = slots >= 0
        sl = slots[hit]
        valid = (self.cc[sl] <= self.cs[sl] + self.s) & (self.cc[sl] >= c_g[hit] - self.s)  # CheckValid
        bad = np.flatnonzero(hit)[~valid]
        pushes = self._remove(slots[bad])
        slots[bad] = -1
        n_remote = int(remote.sum())
        st = self.stats
        st["reads"] += n_remote
        st["hits"] += int(valid.sum())
        st["invalidations"] += int(bad.shape[0])
        st["misses"] += n_remote - int(hit.sum())
        st["fetches"] += n_remote - int(valid.sum())
        return slots, slots < 0, pushes

    def insert(self, keys: np.ndarray, rows: np.ndarray, c_g: np.ndarray) -> np.ndarray:
        """``Fetch``: cache fetched ``rows`` (n, W) of ``keys`` (n,) (not cached, unique) with
        ``c_s = c_c = c_g`` (n,) -> their slots (n,) int64."""
        n = keys.shape[0]
        if n > self._top:
            self._grow(n - self._top)
        slots = self._free[self._top - n:self._top][::-1].copy()
        self._top -= n
        self._index.assign(keys, slots)
        self.keys[slots], self.rows[slots], self.grad[slots] = keys, rows, 0.0
        self.cs[slots], self.cc[slots], self.uses[slots], self.last[slots] = c_g, c_g, 0, 0
        self.used[slots] = True
        return slots

    def get(self, slots: np.ndarray) -> np.ndarray:
        """Cached rows (n, W) of ``slots`` (a copy)."""
        return self.rows[slots]

    # -- Algorithm 3 ---------------------------------------------------------------------------------
    def write(self, slots: np.ndarray, grads: np.ndarray) -> Pushes:
        """Algorithm 3 for the cached ``slots`` (n,) of a mini-batch and their gradients (n, P):
        local step, accumulate, ``c_c += 1``; then ``Evict()``: entries that can no longer be valid and
        the policy's victims beyond the capacity -> their Pushes."""
        self.tick += 1
        if slots.shape[0]:
            self.rows[slots] = self.opt.apply(self.rows[slots], grads)  # read-my-updates
            self.grad[slots] += grads
            self.cc[slots] += 1
            self.uses[slots] += 1
            self.last[slots] = self.tick
        stale = slots[self.cc[slots] > self.cs[slots] + self.s]
        out = [self._remove(stale)]
        over = len(self) - self.capacity
        if over > 0:
            occ = np.flatnonzero(self.used)
            prio = (self.keys[occ], self.last[occ]) + ((self.uses[occ],) if self.policy == "lfu" else ())
            victims = occ[np.lexsort(prio)[:over]]
            self.stats["evictions"] += over
            out.append(self._remove(victims))
        return Pushes.concat(out)

    def drain(self) -> Pushes:
        """Push every entry and empty the cache (a consistent cut, the end of training)."""
        pushes = self._remove(np.flatnonzero(self.used))
        self._index.clear()
        self._alloc(self.keys.shape[0])
        self.tick = 0
        return pushes

    def _remove(self, slots: np.ndarray) -> Pushes:
        """Drop ``slots`` -> the Pushes of those with an accumulated gradient (``c_c > c_s``)."""
        pend = slots[self.cc[slots] > self.cs[slots]]
        out = Pushes(self.keys[pend], self.cc[pend], self.grad[pend])
        if slots.shape[0]:
            self._index.erase(self.keys[slots])
            self.used[slots] = False
            self.grad[slots] = 0.0
            n = slots.shape[0]
            self._free[self._top:self._top + n] = slots[::-1]
            self._top += n
        self.stats["pushes"] += len(out)
        return out


class HetOwner:
    """The owner side: ``c_g`` of every owned key (0 until its first update), the pushed gradients'
    application with the row optimizer ``opt``, and the pending pushes of rows not placed yet.

    ``store.update_owned(keys, update) -> done (n,) bool`` applies ``update(sel, rows) -> new rows``
    to the current rows of owned ``keys`` wherever they live (``sel`` indexes ``keys``) and says which
    it could reach (``ParameterHierarchy.update_owned``)."""

    def __init__(self, opt, row_params: int):
        self.opt, self.P = opt, int(row_params)
        self._clock = KeyIndex(width=1)
        self._pending = Pushes.empty(self.P)

    def clocks(self, keys: np.ndarray) -> np.ndarray:
        """``c_g`` (n,) int64 of owned ``keys`` (n,)."""
        return self._clock.lookup(keys)[0][:, 0]

    def apply(self, store, pushes: Pushes) -> None:
        """Apply ``pushes`` (from every rank, in rank order) to owned rows: per key the gradients summed
        in that order and one optimizer step; ``c_g = max(c_g, pushed c_c)``."""
        if not len(pushes):
            return
        u, _, inv = unique_counts(pushes.keys)
        g = segment_sum(pushes.grads, inv, u.shape[0])
        c = np.zeros(u.shape[0], np.int64)
        np.maximum.at(c, inv, pushes.clocks)
        self._clock.assign(u, np.maximum(self.clocks(u), c))
        self._update(store, u, g)

    def apply_pending(self, store, keys: np.ndarray | None = None) -> None:
        """Apply the pending pushes of ``keys`` (None: all) now that their rows are placed. Raises
        InternalError if one still is not (only checked for ``keys=None``: a consistent cut)."""
        pk = self._pending
        if not len(pk):
            return
        take = np.ones(len(pk), np.bool_) if keys is None else np.isin(pk.keys, keys)
        if not take.any():
            return
        self._pending = Pushes(pk.keys[~take], pk.clocks[~take], pk.grads[~take])
        self._update(store, pk.keys[take], pk.grads[take])
        if keys is None and len(self._pending):
            raise InternalError(f"{len(self._pending)} pushed rows are still not placed at a consistent cut")

    @property
    def pending(self) -> int:
        return len(self._pending)

    def _update(self, store, keys: np.ndarray, grads: np.ndarray) -> None:
        done = store.update_owned(keys, lambda sel, rows: self.opt.apply(rows, grads[sel]))
        if not done.all():  # resident for a batch prepared ahead: wait until it is placed
            left = Pushes(keys[~done], np.zeros(int((~done).sum()), np.int64), grads[~done])
            both = Pushes.concat([self._pending, left])
            u, _, inv = unique_counts(both.keys)
            self._pending = Pushes(u, np.zeros(u.shape[0], np.int64), segment_sum(both.grads, inv, u.shape[0]))
