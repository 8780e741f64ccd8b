"""Owner exchange: alltoallv of variable-size key and row blocks, pull from / push to key owners."""

from __future__ import annotations

import numpy as np

from .._keys import as_keys
from ..errors import InvalidInputError
from ._cuda import is_device_array, to_host
from ._mpi import mpi_type
from ._stats import KINDS, OWNER_WRITEBACK, SPARSE_PULL, metered
from ._wait import SPIN


def _alltoallv(comm, data, counts, meter, waiter):
    """Send ``data[displ[j]:displ[j]+counts[j]]`` to rank j; returns (received data, recv counts).

    data (n, *row) C-contiguous host array grouped by destination; counts (size,) rows per destination.
    REQUIRES the same row shape and dtype on every rank. Collective; waits as ``waiter`` says.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    counts = np.ascontiguousarray(counts, dtype=np.int64)
    if counts.shape != (size,) or (counts < 0).any() or int(counts.sum()) != data.shape[0]:
        raise InvalidInputError(
            f"counts must be ({size},) non-negative and sum to the {data.shape[0]} rows given, got {counts}"
        )
    row_shape = data.shape[1:]
    per_row = int(np.prod(row_shape, dtype=np.int64))
    recv_counts = np.empty(size, dtype=np.int64)
    waiter.run(lambda: comm.Alltoall(counts, recv_counts), lambda: comm.Ialltoall(counts, recv_counts))
    out = np.empty((int(recv_counts.sum()),) + row_shape, dtype=data.dtype)
    if size == 1:
        out[...] = data
    else:
        mtype = mpi_type(data.dtype)
        s, r = [data, (counts * per_row, None), mtype], [out, (recv_counts * per_row, None), mtype]
        waiter.run(lambda: comm.Alltoallv(s, r), lambda: comm.Ialltoallv(s, r))
    meter.sent((int(counts.sum()) - int(counts[rank])) * per_row * data.dtype.itemsize)
    return out, recv_counts


def exchange(comm, send, stats=None, kind: str = SPARSE_PULL, waiter=SPIN):
    """Alltoallv of variable-size blocks of keys (n,) uint64 or rows (n, d) over ``comm``. Collective.

    send is either a *list* of ``comm.size`` host arrays (block j goes to rank j), giving a list of the
    blocks received from each rank, or a *tuple* ``(data, counts)`` (data grouped by destination,
    counts (size,) int rows per destination), giving ``(received data, received counts)`` grouped by
    source rank. REQUIRES the same dtype and trailing shape on every rank (also for empty blocks:
    pass ``np.empty((0, d))``). Bytes sent to other ranks go to ``stats`` under ``kind``. MPI calls wait as
    ``waiter`` says (``_wait.Waiter``, here and in :func:`pull_remote`, :func:`push_to_owners`; default: spin).
    """
    if kind not in KINDS:
        raise InvalidInputError(f"unknown traffic kind {kind!r}; expected one of {KINDS}")
    size = comm.Get_size()
    as_list = isinstance(send, list)
    if as_list:
        if len(send) != size:
            raise InvalidInputError(f"send must have one block per rank ({size}), got {len(send)}")
        blocks = [np.asarray(b) for b in send]
        counts = np.array([b.shape[0] for b in blocks], dtype=np.int64)
        data = np.ascontiguousarray(np.concatenate(blocks)) if size > 1 else np.ascontiguousarray(blocks[0])
    elif isinstance(send, tuple) and len(send) == 2:
        data, counts = np.ascontiguousarray(send[0]), send[1]
    else:
        raise InvalidInputError("send must be a list of comm.size arrays or a tuple (data, counts)")
    with metered(stats, kind) as meter:
        out, recv_counts = _alltoallv(comm, data, counts, meter, waiter)
    if as_list:
        return np.split(out, np.cumsum(recv_counts)[:-1])
    return out, recv_counts


def _group_by_owner(comm, keys, owner):
    size = comm.Get_size()
    owner = np.asarray(owner)
    if owner.shape != keys.shape:
        raise InvalidInputError(f"owner must have shape {keys.shape} like keys, got {owner.shape}")
    if owner.dtype.kind not in "iu":
        raise InvalidInputError(f"owner must be an integer array of ranks, got {owner.dtype}")
    if owner.size and (owner.min() < 0 or owner.max() >= size):
        raise InvalidInputError(f"owner ranks must lie in [0, {size}), got [{owner.min()}, {owner.max()}]")
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=size).astype(np.int64)
    return order, counts


def _as_rows(rows, n, what):
    rows = to_host(rows) if is_device_array(rows) else np.asarray(rows)
    if rows.ndim != 2 or rows.shape[0] != n:
        raise InvalidInputError(f"{what} must be (n, d) rows with n = {n}, got shape {rows.shape}")
    return np.ascontiguousarray(rows)


def pull_remote(comm, keys, owner, serve_fn, stats=None, waiter=SPIN):
    """Fetch the rows of ``keys`` from their owners. Collective over ``comm``; blocking.

    keys (n,) uint64; owner (n,) int — rank of ``comm`` owning each key (may be this rank).
    serve_fn(keys (m,) uint64) -> rows (m, d) is called exactly once on every rank with the keys the
    ranks asked it for (grouped by asking rank; m may be 0 — it must still return shape (0, d)).
    Returns rows (n, d) host array aligned with ``keys``. REQUIRES the same d and dtype from every
    serve_fn. Pass unique keys: duplicates are fetched twice. Bytes (requests and replies to other
    ranks) go to ``stats`` under ``"sparse_pull"``.
    """
    keys = as_keys(keys)
    order, counts = _group_by_owner(comm, keys, owner)
    with metered(stats, SPARSE_PULL) as meter:
        asked, asked_counts = _alltoallv(comm, keys[order], counts, meter, waiter)
        served = _as_rows(serve_fn(asked), asked.shape[0], "serve_fn's result")
        got, got_counts = _alltoallv(comm, served, asked_counts, meter, waiter)
    if not np.array_equal(got_counts, counts):  # cannot happen with a conforming MPI
        raise InvalidInputError(f"owners replied {got_counts} rows for {counts} keys asked")
    out = np.empty_like(got)
    out[order] = got
    return out


def push_to_owners(comm, keys, rows, owner, apply_fn, stats=None, waiter=SPIN):
    """Send each (key, row) to the key's owner, which calls ``apply_fn(keys, rows)``. Collective.

    keys (n,) uint64; rows (n, d) host or device; owner (n,) int ranks of ``comm``. apply_fn is called
    exactly once on every rank with the keys (m,) uint64 and rows (m, d) it received, grouped by
    sending rank (m may be 0); its return value is returned. REQUIRES the same d and dtype on every
    rank. Bytes sent to other ranks go to ``stats`` under ``"owner_writeback"``.
    """
    keys = as_keys(keys)
    rows = _as_rows(rows, keys.shape[0], "rows")
    order, counts = _group_by_owner(comm, keys, owner)
    with metered(stats, OWNER_WRITEBACK) as meter:
        in_keys, _ = _alltoallv(comm, keys[order], counts, meter, waiter)
        in_rows, _ = _alltoallv(comm, rows[order], counts, meter, waiter)
    return apply_fn(in_keys, in_rows)
