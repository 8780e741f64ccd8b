"""CUDA kernels of the open-addressing hash table (the twin of ``_cpu_kernels.py``).

Same slot layout as the CPU kernels (see that module and ``hps/table.py`` for the contract):

- ``tkeys`` (S,) uint64: the key of each slot, ``EMPTY`` (all ones) where no key ever lived.
- ``tstate`` (S,) int32: ``0`` live, ``1`` erased (a tombstone keeping its key; only that key
  revives it). An empty slot always has state 0.
- ``tvals`` (S, dim) float32/float64: the row of each slot; every slot that is not live holds zeros.
- ``tscore`` (S,) uint64: the cache score of each slot (``_cache.py``); 0 where not live.
- ``owner`` (S,) int32 scratch: ``-1`` between calls. An insert marks each slot with the largest
  batch index that maps to it (``atomic.max``), so the last duplicate wins deterministically.

Linear probing from ``mix64(key) & (S - 1)``. Keys are claimed with ``atomic.cas`` on ``tkeys``
(EMPTY -> key), tombstones revived with ``atomic.cas`` on ``tstate`` (1 -> 0), rows accumulated with
``atomic.add``. Within one launch a slot's key only ever goes EMPTY -> key, so every thread probing
for the same key stops at the same slot.

Launch shapes (``hps._launch``): every kernel loops grid-stride, so any grid covers any batch. "1-D"
kernels take a 1-D block, one thread per key per round. "Row" kernels take a 2-D block ``(bx, by)``:
``threadIdx.y`` picks one of ``by`` keys of the block per round, ``threadIdx.x`` strides over the
``dim`` columns, so a warp reads/writes consecutive columns of a row (coalesced).

The sentinel key (all ones) is never found, claimed or erased: lookups answer "absent" and the
claiming kernels count it as failed, so a batch holding it leaves the table as it was.

Kernels and device functions only: no state, no I/O; every constant is an argument or a literal.
Counters ``counts`` (3,) int64 are added to (the host zeroes them).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .._grid_kernels import row0 as _row0
from .._grid_kernels import row_step as _row_step
from .._hashing import mix64

# -- device functions ---------------------------------------------------------------------------


@cuda.jit(device=True)
def _find(tkeys, key):
    """Slot (int64) holding ``key``, live or tombstone; -1 when absent. Reads only."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    if key == empty:
        return np.int64(-1)
    mask = np.uint64(tkeys.shape[0] - 1)
    s = mix64(key) & mask
    for _ in range(tkeys.shape[0]):
        k = tkeys[s]
        if k == key:
            return np.int64(s)
        if k == empty:
            return np.int64(-1)
        s = (s + np.uint64(1)) & mask
    return np.int64(-1)


@cuda.jit(device=True)
def _find_or_claim(tkeys, tstate, key):
    """(slot int64, kind int32) for ``key``, claiming an empty slot or reviving its tombstone.

    kind: 1 this thread claimed an empty slot, 2 this thread revived a tombstone, 0 the key was live
    (or another thread of this launch claimed/revived it), -1 no free slot or the sentinel key (slot
    is -1)."""
    empty = np.uint64(0xFFFFFFFFFFFFFFFF)
    if key == empty:
        return np.int64(-1), np.int32(-1)
    mask = np.uint64(tkeys.shape[0] - 1)
    s = mix64(key) & mask
    for _ in range(tkeys.shape[0]):
        k = tkeys[s]
        if k == empty:
            k = cuda.atomic.cas(tkeys, s, empty, key)
            if k == empty:
                return np.int64(s), np.int32(1)
        if k == key:
            if tstate[s] != np.int32(0):
                if cuda.atomic.cas(tstate, s, np.int32(1), np.int32(0)) == np.int32(1):
                    return np.int64(s), np.int32(2)
            return np.int64(s), np.int32(0)
        s = (s + np.uint64(1)) & mask
    return np.int64(-1), np.int32(-1)


@cuda.jit(device=True)
def _add_counts(counts, c0, c1, c2):
    """counts[0..2] += per-thread c0..c2 (a thread's totals over its grid-stride rounds), reduced per
    block in shared memory (one global atomic per block and counter). REQUIRES: a 1-D block, and every
    thread of the block calls it."""
    sh = cuda.shared.array(3, dtype=np.int64)
    t = cuda.threadIdx.x
    if t == 0:
        sh[0] = 0
        sh[1] = 0
        sh[2] = 0
    cuda.syncthreads()
    if c0 != 0:
        cuda.atomic.add(sh, 0, np.int64(c0))
    if c1 != 0:
        cuda.atomic.add(sh, 1, np.int64(c1))
    if c2 != 0:
        cuda.atomic.add(sh, 2, np.int64(c2))
    cuda.syncthreads()
    if t == 0:
        for c in range(3):
            if sh[c] != 0:
                cuda.atomic.add(counts, c, sh[c])


# -- kernels ------------------------------------------------------------------------------------


@cuda.jit
def has_key(keys, key, hit):
    """1-D. hit (1,) int64 is set to 1 if any of keys (n,) uint64 equals ``key``."""
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        if keys[i] == key:
            hit[0] = 1


@cuda.jit
def upsert_claim(tkeys, tstate, owner, keys, mark, counts):
    """1-D. Find or claim a slot for each of keys (n,); counts += (n_new, n_revived, n_failed).

    n_new includes revived keys. With ``mark``, owner[slot] = max batch index of the slot's key."""
    c_new = 0
    c_rev = 0
    c_fail = 0
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        s, kind = _find_or_claim(tkeys, tstate, keys[i])
        if kind < 0:
            c_fail += 1
        else:
            if kind > 0:
                c_new += 1
            if kind == 2:
                c_rev += 1
            if mark:
                cuda.atomic.max(owner, s, np.int32(i))
    _add_counts(counts, c_new, c_rev, c_fail)


@cuda.jit(device=True)
def _write_row(tvals, owner, rows, i, s, accumulate):
    """The x-threads of a row kernel add row ``i`` into slot ``s`` (atomically), or assign it when
    occurrence ``i`` is the one marked in ``owner`` (the last duplicate of its key)."""
    if accumulate:
        for j in range(cuda.threadIdx.x, tvals.shape[1], cuda.blockDim.x):
            cuda.atomic.add(tvals, (s, j), rows[i, j])
    elif owner[s] == i:
        for j in range(cuda.threadIdx.x, tvals.shape[1], cuda.blockDim.x):
            tvals[s, j] = rows[i, j]


@cuda.jit
def upsert_rows(tkeys, tvals, owner, keys, rows, accumulate):
    """Row kernel. Add (``accumulate``) or assign rows (n, dim) into the slots of keys (n,), which
    ``upsert_claim`` placed. Assignment writes only the marked (last) occurrence of a key."""
    for i in range(_row0(), keys.shape[0], _row_step()):
        s = _find(tkeys, keys[i])
        if s >= 0:
            _write_row(tvals, owner, rows, i, s, accumulate)


@cuda.jit
def unmark_keys(tkeys, owner, keys):
    """1-D. owner[slot of each key] = -1 (after ``upsert_rows``)."""
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        s = _find(tkeys, keys[i])
        if s >= 0:
            owner[s] = np.int32(-1)


@cuda.jit
def claim(tkeys, tstate, keys, slots, is_new, counts):
    """1-D. Two-phase claim without touching rows; counts += (n_new, n_revived, n_failed).

    slots (n,) int64 out: the slot, -1 where no slot was free. is_new (n,) int8 out: 1 claimed an
    empty slot, 2 revived a tombstone, 0 otherwise (live, failed, or a duplicate of a claimer)."""
    c_new = 0
    c_rev = 0
    c_fail = 0
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        s, kind = _find_or_claim(tkeys, tstate, keys[i])
        slots[i] = s
        if kind < 0:
            c_fail += 1
            is_new[i] = np.int8(0)
        else:
            is_new[i] = np.int8(kind)
            if kind > 0:
                c_new += 1
            if kind == 2:
                c_rev += 1
    _add_counts(counts, c_new, c_rev, c_fail)


@cuda.jit
def rollback(tkeys, tstate, slots, is_new):
    """1-D. Undo ``claim``: empty what it claimed, re-bury what it revived (rows never written)."""
    for i in range(cuda.grid(1), slots.shape[0], cuda.gridsize(1)):
        if is_new[i] == 1:
            tkeys[slots[i]] = np.uint64(0xFFFFFFFFFFFFFFFF)
        elif is_new[i] == 2:
            tstate[slots[i]] = np.int32(1)


@cuda.jit
def mark_slots(owner, slots):
    """1-D. owner[slots[i]] = max i over the batch (the last occurrence of each slot)."""
    for i in range(cuda.grid(1), slots.shape[0], cuda.gridsize(1)):
        cuda.atomic.max(owner, slots[i], np.int32(i))


@cuda.jit
def unmark_slots(owner, slots):
    """1-D. owner[slots[i]] = -1."""
    for i in range(cuda.grid(1), slots.shape[0], cuda.gridsize(1)):
        owner[slots[i]] = np.int32(-1)


@cuda.jit
def write_rows(tvals, owner, slots, rows, accumulate):
    """Row kernel. Add or assign rows (n, dim) into claimed slots (n,) int64; assignment writes only
    where owner[slot] == i (``mark_slots`` ran first)."""
    for i in range(_row0(), slots.shape[0], _row_step()):
        _write_row(tvals, owner, rows, i, slots[i], accumulate)


#: Most threads a block of ``get`` may have (its shared slot array's length).
GET_MAX_BLOCK = 256


@cuda.jit
def get(tkeys, tstate, tvals, keys, out, found, hit):
    """1-D, blockDim.x <= GET_MAX_BLOCK. out (n, dim) gets each live key's row, zeros otherwise; found
    (n,) bool; hit (1,) int64 is set to 1 when a key is the sentinel (answered absent; the blocking
    caller raises).

    Two phases per round of blockDim.x keys (HierarchicalKV's find: probe per thread, copy per tile):
    each thread probes its own key (a block keeps blockDim.x independent probes in flight, as
    ``contains`` does) and leaves the slot in shared memory (-1: not live); then the block copies the
    round's rows, w = min(32, blockDim.x, next power of two >= dim) threads per row, so a warp moves 32 / w whole
    rows per instruction (coalesced). The round loop is uniform over the block (``syncthreads``)."""
    sh = cuda.shared.array(GET_MAX_BLOCK, dtype=np.int64)
    t = cuda.threadIdx.x
    nb = cuda.blockDim.x
    n = keys.shape[0]
    dim = tvals.shape[1]
    w = 1
    while w < dim and w < 32 and w < nb:
        w *= 2
    rows_per = nb // w
    r0 = t // w
    c0 = t - r0 * w
    for base in range(cuda.blockIdx.x * nb, n, cuda.gridDim.x * nb):
        i = base + t
        s = np.int64(-1)
        if i < n:
            key = keys[i]
            s = _find(tkeys, key)
            live = s >= 0 and tstate[s] == 0
            found[i] = live
            if key == np.uint64(0xFFFFFFFFFFFFFFFF):
                hit[0] = 1
            if not live:
                s = np.int64(-1)
        sh[t] = s
        cuda.syncthreads()
        m = min(nb, n - base)
        for r in range(r0, m, rows_per):
            sr = sh[r]
            if sr >= 0:
                for j in range(c0, dim, w):
                    out[base + r, j] = tvals[sr, j]
            else:
                for j in range(c0, dim, w):
                    out[base + r, j] = 0
        cuda.syncthreads()


@cuda.jit
def contains(tkeys, tstate, keys, found, hit):
    """1-D. found (n,) bool: the key is live; hit (1,) int64 set to 1 on the sentinel key (as ``get``)."""
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        key = keys[i]
        s = _find(tkeys, key)
        found[i] = s >= 0 and tstate[s] == 0
        if key == np.uint64(0xFFFFFFFFFFFFFFFF):
            hit[0] = 1


@cuda.jit
def erase(tkeys, tstate, tvals, tscore, keys, counts):
    """1-D. Turn live keys into tombstones with zeroed rows and scores; counts[0] += keys erased
    (duplicates once)."""
    c = 0
    for i in range(cuda.grid(1), keys.shape[0], cuda.gridsize(1)):
        s = _find(tkeys, keys[i])
        if s >= 0 and cuda.atomic.cas(tstate, s, np.int32(0), np.int32(1)) == np.int32(0):
            for j in range(tvals.shape[1]):
                tvals[s, j] = 0
            tscore[s] = np.uint64(0)
            c += 1
    _add_counts(counts, c, 0, 0)


@cuda.jit
def gather_rows(tvals, slots, out):
    """Row kernel. out (m, dim) = tvals[slots] for slots (m,) int64."""
    for i in range(_row0(), slots.shape[0], _row_step()):
        s = slots[i]
        for j in range(cuda.threadIdx.x, tvals.shape[1], cuda.blockDim.x):
            out[i, j] = tvals[s, j]


@cuda.jit
def cast_rows(rows, out):
    """Row kernel. out (n, dim) = rows (n, dim) converted to out's dtype."""
    for i in range(_row0(), out.shape[0], _row_step()):
        for j in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
            out[i, j] = rows[i, j]


@cuda.jit
def clear(tkeys, tstate, tvals, tscore, owner):
    """Row kernel over the S slots: every slot empty, state 0, row zeros, score 0, owner -1."""
    for s in range(_row0(), tkeys.shape[0], _row_step()):
        if cuda.threadIdx.x == 0:
            tkeys[s] = np.uint64(0xFFFFFFFFFFFFFFFF)
            tstate[s] = np.int32(0)
            tscore[s] = np.uint64(0)
            owner[s] = np.int32(-1)
        for j in range(cuda.threadIdx.x, tvals.shape[1], cuda.blockDim.x):
            tvals[s, j] = 0


@cuda.jit
def live_entries(tkeys, tstate, tscore, protect, out_score, out_key, out_slot, counts):
    """1-D over the S slots: every live slot whose score's last batch (its low 32 bits, ``_cache.py``)
    is below ``protect`` (uint64; 2**32 for every live slot) goes to (out_score, out_key, out_slot)
    (m,), in no particular order: per round a block counts its slots in shared memory, takes its range
    with one ``atomic.add`` on counts[0], and each thread writes at the block's base plus its own
    ticket. counts[0] ends at their number, which may exceed m (then only m are written).
    REQUIRES: a 1-D block, and every thread of the block runs (no early return)."""
    sh = cuda.shared.array(2, dtype=np.int64)
    t = cuda.threadIdx.x
    n = tkeys.shape[0]
    for base in range(cuda.blockIdx.x * cuda.blockDim.x, n, cuda.gridsize(1)):  # same rounds per block
        if t == 0:
            sh[0] = 0
        cuda.syncthreads()
        s = base + t
        p = np.int64(-1)
        if s < n and tkeys[s] != np.uint64(0xFFFFFFFFFFFFFFFF) and tstate[s] == 0 \
                and (tscore[s] & np.uint64(0xFFFFFFFF)) < protect:
            p = cuda.atomic.add(sh, 0, np.int64(1))
        cuda.syncthreads()
        if t == 0 and sh[0] > 0:
            sh[1] = cuda.atomic.add(counts, 0, sh[0])
        cuda.syncthreads()
        if p >= 0:
            q = sh[1] + p
            if q < out_slot.shape[0]:
                out_score[q] = tscore[s]
                out_key[q] = tkeys[s]
                out_slot[q] = np.int64(s)
        cuda.syncthreads()


@cuda.jit
def gather_keys(tkeys, slots, out_keys):
    """1-D. out_keys (m,) uint64 = tkeys[slots] for slots (m,) int64."""
    for i in range(cuda.grid(1), slots.shape[0], cuda.gridsize(1)):
        out_keys[i] = tkeys[slots[i]]
