"""Feature admission and expiry (``--admit-after K``, ``--expire-after B``), decided by key owners.

**Admission** (DeepRec's counter filter, DynamicEmb's admission). A key gets its own row from the
batch in which its K-th occurrence is counted; before that every occurrence of it uses the shared row
of its field, the reserved key ``key | SHARED_LOW`` (the key's field id in the high 16 bits, all ones
below: ``field << 48 | 0xFFFF_FFFF_FFFF``; a raw value whose 48-bit hash is all ones would share that
row, probability 2**-48 per value). Per batch, in the prepare stage, every rank sends the distinct
keys of its local batch with their occurrence counts to the keys' owners (``mix64(key ^ NODE_SALT)
% N``, two alltoallv); the owner adds the counts of keys it has not admitted to its count-min sketch
and admits those whose estimate reached K, and answers one flag per key (one alltoallv back); every
rank then rewrites the keys of its examples that were not admitted to their field's shared key. One
owner decides each key, so the ranks cannot disagree. ``K <= 1`` admits every key at once (no
exchange: the run is exactly a run without admission).

The counts live in a **count-min sketch** per rank (conservative update): ``SKETCH_DEPTH`` = 4 rows of
``--admit-sketch-width`` w uint32 counters, 16·w bytes (16 MiB at the default w = 2**20), whatever the
number of keys. An estimate is never below the true count; it exceeds it by more than e·N/w with
probability at most e**-4 (< 2 %), N being the occurrences in the sketch. To keep N bounded on an
endless stream, every counter is halved once N reaches w (then N ≈ w/2): the overcount stays below
e ≈ 2.7 occurrences (with probability > 98 %), and counts of keys that stop coming decay, so K
counts "K recent occurrences". Only keys not admitted yet are counted; an admitted key is one the
owner knows (``_seen`` below, exact). The sketch of N ranks holds 1/N of the keys each, so its
collisions — not the decisions' consistency — can differ from a 1-process run; with no collision
(a wide sketch) both admit the same keys in the same batches (``tests/test_admission.py``).

**Expiry** (Monolith's expirable embeddings). The owner keeps ``_seen``: key -> last batch whose
working set held it, for every key it has a row for (a ``KeyIndex``: 40-140 B per key, as it grows
by doubling, like the SSD-PS index). Every ``sweep`` = max(1, B // 8) batches it deletes the keys
unused for B batches from every tier (``ParameterHierarchy.delete``: MEM-PS and SSD-PS; such a key
is not resident in HBM-PS, since B >= the residency window), so a key is deleted between B and
B + sweep - 1 batches after its last use. A key that comes back is born again from the key-seeded
initializer (and must be admitted again unless the sketch still counts it).

**Checkpoints.** The state (``_seen``, the sketch, its mass, the counters) is saved beside the
rows of the rank's checkpoint shard, as of the checkpoint's batch, and restored by ``--resume``.

Thread safety: :meth:`admit`, :meth:`touch` and :meth:`expire` run in the prepare thread;
:meth:`state` is taken there too; :meth:`admitted_mask` is called by evaluation while the prepare
thread may run, so ``_seen`` is guarded by a lock.
"""

from __future__ import annotations

import threading
from dataclasses import replace

import numpy as np

from .._index import KeyIndex
from ..comm import SPARSE_KEYS
from ..errors import InvalidInputError
from ..mem import unique_counts
from . import _admission_kernels as K
from ._features import Feature

#: Low 48 bits of a shared (not-admitted) key: ``field << 48 | SHARED_LOW``. Persistent: never change.
SHARED_LOW = np.uint64((1 << 48) - 1)
#: Rows of the count-min sketch (independent hashes).
SKETCH_DEPTH = 4
#: Salts of the sketch's rows (persistent in checkpoints: never change).
SKETCH_SALTS = np.array([0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0, 0x082EFA98EC4E6C89],
                        dtype=np.uint64)
#: Group of a checkpoint's ``sparse-rank{r}-of-{n}.h5`` holding the rank's state (never rename).
CHECKPOINT_GROUP = "feature_filter"
#: Expiry sweeps every max(1, expire_after // SWEEPS_PER_WINDOW) batches.
SWEEPS_PER_WINDOW = 8


def shared_keys(keys: np.ndarray) -> np.ndarray:
    """The shared key of each key's field: ``keys | SHARED_LOW``. keys (n,) uint64 -> (n,) uint64."""
    return keys | SHARED_LOW


class NoFeatureFilter(Feature):
    """A job without admission or expiry: a resume from a checkpoint that holds their state (written
    with ``--admit-after`` / ``--expire-after``) is refused, as :class:`FeatureFilter` refuses one that
    lacks it: the run would go on without the feature the checkpointed run had."""

    name = "no_feature_filter"

    def read_checkpoint(self, h) -> None:
        if CHECKPOINT_GROUP in h:
            raise InvalidInputError(f"checkpoint {h.filename} holds admission/expiry state: resume with the "
                                    "--admit-after and --expire-after of the run that wrote it")


class FeatureFilter(Feature):
    """One rank's admission and expiry state (see the module docstring). ``coll``: Collectives;
    ``admit_after``: K; ``expire_after``: B (0 = never); ``sketch_width``: w (a power of two);
    ``window``: the residency window of the hierarchy it deletes from (B must reach it: an expiring key
    must have left HBM-PS). A feature (``_features``): it rewrites a batch's keys before it is planned,
    sweeps after it is resident, and keeps its state in checkpoints. Raises InvalidInputError for a B
    below the window."""

    name = "filter"
    needs_host_keys = True  # every batch's keys are touched on the host (known keys, their last use)

    def __init__(self, coll, admit_after: int, expire_after: int, sketch_width: int, window: int = 0):
        if 0 < expire_after < window:
            raise InvalidInputError(f"--expire-after must be at least {window} batches (the residency window: "
                                    f"an expiring key must have left HBM-PS), got {expire_after}")
        self.coll = coll
        self.admit_after = int(admit_after)
        self.expire_after = int(expire_after)
        self.sweep = max(1, self.expire_after // SWEEPS_PER_WINDOW)
        self.sketch = np.zeros((SKETCH_DEPTH, int(sketch_width)), np.uint32) if self.admitting else None
        self.mass = 0
        self.admitted = 0          # keys this rank admitted through the sketch
        self.expired = 0           # keys this rank deleted for expiry
        self._seen = KeyIndex(width=1)
        self._lock = threading.Lock()
        self._delete = None  # the hierarchy's delete (start)

    @property
    def admitting(self) -> bool:
        return self.admit_after > 1

    # -- admission (prepare stage, collective over the prepare channel) -----------------------------
    def admit(self, keys: np.ndarray) -> np.ndarray:
        """Count this rank's key occurrences ``keys`` (nnz,) uint64 of one local batch at their owners
        and return them with every key not admitted replaced by its field's shared key (nnz,) uint64.
        Collective over the prepare channel (three alltoallv and one alltoall); identity when K <= 1."""
        if not self.admitting:
            return keys
        uniq, counts, inv = unique_counts(keys)
        ch = self.coll.prepare
        if self.coll.size == 1:
            flags = self._decide(uniq, counts)
        else:
            asked, recv, order, send = ch.exchange_by_owner(uniq, SPARSE_KEYS)
            asked_counts = ch.alltoallv(counts[order], send, recv, SPARSE_KEYS)
            ukeys, _, uinv = unique_counts(asked)
            total = np.bincount(uinv, weights=asked_counts, minlength=ukeys.shape[0]).astype(np.int64)
            answer = self._decide(ukeys, total)[uinv].astype(np.uint8)
            got = ch.alltoallv(answer, recv, send, SPARSE_KEYS)
            flags = np.empty(uniq.shape[0], np.bool_)
            flags[order] = got.astype(np.bool_)
        out = np.empty_like(keys)
        K.rewrite_keys(keys, flags[inv], SHARED_LOW, out)
        return out

    def _decide(self, keys: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Owner side: (n,) bool admitted, for distinct owned ``keys`` with their batch ``counts``."""
        with self._lock:
            known = self._seen.contains(keys)
        flags = known | ((keys & SHARED_LOW) == SHARED_LOW)
        new = np.flatnonzero(~flags)
        if new.shape[0]:
            est = np.empty(new.shape[0], np.int64)
            self.mass += int(K.sketch_add(self.sketch, SKETCH_SALTS, keys[new], counts[new], est))
            ok = est >= self.admit_after
            flags[new[ok]] = True
            self.admitted += int(ok.sum())
            if self.mass >= self.sketch.shape[1]:  # ageing keeps N <= w: see the module docstring
                K.halve(self.sketch)
                self.mass //= 2
        return flags

    def admitted_mask(self, keys: np.ndarray) -> np.ndarray:
        """(n,) bool: which owned ``keys`` have their own row (read only; evaluation)."""
        if not self.admitting:
            return np.ones(keys.shape[0], np.bool_)
        with self._lock:
            known = self._seen.contains(keys)
        return known | ((keys & SHARED_LOW) == SHARED_LOW)

    # -- expiry (prepare stage, local) ------------------------------------------------------------
    def touch(self, index: int, owned: np.ndarray) -> None:
        """Batch ``index`` uses the owned keys ``owned`` (distinct uint64): they are known, used now."""
        with self._lock:
            self._seen.assign(owned, np.full(owned.shape[0], index, np.int64))

    def expire(self, index: int, delete) -> int:
        """At a sweep batch, delete (``delete(keys)``) the keys unused since batch ``index - B`` and
        forget them -> keys expired now. REQUIRES: :meth:`touch` of batch ``index`` done."""
        if not self.expire_after or index % self.sweep:
            return 0
        with self._lock:
            keys, last = self._seen.items()
        old = keys[last[:, 0] <= index - self.expire_after]
        if old.shape[0]:
            delete(old)
            with self._lock:
                self._seen.erase(old)
            self.expired += int(old.shape[0])
        return int(old.shape[0])

    # -- checkpoints --------------------------------------------------------------------------------
    def state(self) -> dict:
        """A copy of the whole state (arrays and counters), for a checkpoint."""
        with self._lock:
            keys, last = self._seen.items()
        return {"seen_keys": keys.copy(), "seen_last": last[:, 0].copy(),
                "sketch": None if self.sketch is None else self.sketch.copy(),
                "mass": self.mass, "admitted": self.admitted, "expired": self.expired}

    def load_state(self, st: dict) -> None:
        """Restore :meth:`state` (resume)."""
        with self._lock:
            self._seen.clear()
            self._seen.assign(st["seen_keys"], st["seen_last"])
        if self.sketch is not None and st.get("sketch") is not None:
            self.sketch[...] = st["sketch"]
        self.mass, self.admitted, self.expired = int(st["mass"]), int(st["admitted"]), int(st["expired"])

    def checkpoint_writer(self, st: dict):
        """``extra(h5file)`` for ``_checkpoint.save``: writes ``st`` (from :meth:`state`) into the group
        :data:`CHECKPOINT_GROUP` of the rank's sparse file."""
        return lambda h: self._write_h5(h.create_group(CHECKPOINT_GROUP), st)

    def read_checkpoint(self, h) -> None:
        """``extra(h5file)`` for ``_checkpoint.load``: restore the state saved by :meth:`checkpoint_writer`."""
        if CHECKPOINT_GROUP not in h:
            raise InvalidInputError(f"checkpoint {h.filename} holds no admission/expiry state: resume with the "
                                    "--admit-after and --expire-after of the run that wrote it")
        self.load_state(self._read_h5(h[CHECKPOINT_GROUP]))

    @staticmethod
    def _write_h5(group, st: dict) -> None:
        group.create_dataset("seen_keys", data=st["seen_keys"])
        group.create_dataset("seen_last", data=st["seen_last"])
        if st["sketch"] is not None:
            group.create_dataset("sketch", data=st["sketch"])
        for k in ("mass", "admitted", "expired"):
            group.attrs[k] = st[k]

    @staticmethod
    def _read_h5(group) -> dict:
        return {"seen_keys": group["seen_keys"][()], "seen_last": group["seen_last"][()],
                "sketch": group["sketch"][()] if "sketch" in group else None,
                **{k: int(group.attrs[k]) for k in ("mass", "admitted", "expired")}}

    # -- the feature's hooks -------------------------------------------------------------------------
    def start(self, job) -> None:
        self._delete = job.hier.delete

    def on_prepare(self, w) -> None:
        """Admission: the keys of ``w`` not admitted become their field's shared key."""
        if self.admitting:
            w.local = replace(w.local, data=replace(w.local.data, keys=self.admit(w.local.data.keys)))

    def on_resident(self, w, resident) -> None:
        """Expiry: the owner's keys of this batch are used now; a sweep may delete old ones. The state as
        of ``w`` is kept when a checkpoint of it may follow (``w.keep_state``)."""
        self.touch(w.index, resident)
        self.expire(w.index, self._delete)
        if w.keep_state:
            w.states[self.name] = self.state()

    def save(self, w, ckpt) -> None:
        st = w.states.get(self.name) if w is not None else None
        ckpt.writers.append(self.checkpoint_writer(st if st is not None else self.state()))

    def eval_keys(self, keys, ch):
        """Keys not admitted are scored with their field's shared row (the owners answer; collective
        over ``ch``)."""
        if not self.admitting:
            return keys
        ok = ch.pull_owned(keys, lambda k: self.admitted_mask(k).astype(np.float32)[:, None])
        return np.where(ok[:, 0] > 0, keys, shared_keys(keys))

    def rank_metrics(self) -> dict:
        with self._lock:
            known = len(self._seen)
        return {"admitted": self.admitted, "expired": self.expired, "known": known}

    def metrics(self, per_rank: list) -> dict:
        """Admission/expiry counts, summed over ranks."""
        return {f"{k}_keys": sum(r[k] for r in per_rank) for k in ("admitted", "expired", "known")}
