"""Owner exchange: alltoallv of variable-size key and row blocks, pull from / push to key owners."""

from __future__ import annotations

import zlib

import numpy as np

from .._keys import as_keys
from ..errors import InvalidInputError, InvalidTypeError
from ._cuda import is_device_array, to_host
from ._mpi import mpi_type
from ._stats import KINDS, OWNER_WRITEBACK, SPARSE_PULL, metered
from ._wait import SPIN


def _alltoallv(comm, data, counts, meter, waiter, error=None):
    """Send ``data[displ[j]:displ[j]+counts[j]]`` to rank j; returns (received data, recv counts).

    data (n, *row) C-contiguous host array grouped by destination; counts (size,) rows per destination.
    REQUIRES the same row shape and dtype on every rank. Each rank sends its (dtype, row shape) with its
    counts, so every rank raises before any data moves (nothing hangs) when they differ (InvalidTypeError),
    or when a rank's counts are wrong or it passes ``error`` (its own invalid input: it raises ``error``,
    the others InvalidInputError naming it). Collective; waits as ``waiter`` says.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    if error is None:
        given = counts
        try:
            counts = np.ascontiguousarray(counts, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            counts = np.empty(0, dtype=np.int64)
        if counts.shape != (size,) or (counts < 0).any() or int(counts.sum()) != len(data):
            error = InvalidInputError(f"counts must be ({size},) non-negative ints summing to the {len(data)} "
                                      f"rows given, got {given!r:.200}")
    row_shape = data.shape[1:]
    sig = -1 if error is not None else zlib.crc32(f"{data.dtype.str}{row_shape}".encode())  # >= 0
    head = np.empty((size, 2), dtype=np.int64)
    head[:, 0], head[:, 1] = 0 if error is not None else counts, sig
    got = np.empty((size, 2), dtype=np.int64)
    waiter.run(lambda: comm.Alltoall(head, got), lambda: comm.Ialltoall(head, got))
    if error is not None:
        raise error
    if (got[:, 1] == -1).any():  # seen by every rank: each raises, none waits in a collective
        raise InvalidInputError(f"rank {int(np.argmax(got[:, 1] == -1))} passed invalid input to the exchange "
                                "(it raised the error there)")
    if (got[:, 1] != sig).any():  # seen by every rank when any two differ: the allgather is collective
        kinds = comm.allgather(f"{data.dtype} rows of shape {row_shape}")
        raise InvalidTypeError("every rank must exchange the same dtype and trailing shape (also with only "
                               f"empty blocks), got {', '.join(f'rank {r}: {k}' for r, k in enumerate(kinds))}")
    recv_counts = np.ascontiguousarray(got[:, 0])
    per_row = int(np.prod(row_shape, dtype=np.int64))
    out = np.empty((int(recv_counts.sum()),) + row_shape, dtype=data.dtype)
    if size == 1:
        out[...] = data
    else:
        mtype = mpi_type(data.dtype)
        s, r = [data, (counts * per_row, None), mtype], [out, (recv_counts * per_row, None), mtype]
        waiter.run(lambda: comm.Alltoallv(s, r), lambda: comm.Ialltoallv(s, r))
    meter.sent((int(counts.sum()) - int(counts[rank])) * per_row * data.dtype.itemsize)
    return out, recv_counts


def _checked(fn, *args, n_out=2):
    """``fn(*args) + (None,)``, or, when it raises a typed input error, empty results and that error: passed
    to :func:`_alltoallv`, which raises it after telling the other ranks (so they raise too)."""
    try:
        return (*fn(*args), None)
    except (InvalidInputError, InvalidTypeError) as e:
        return (np.empty(0, dtype=np.uint64),) + (None,) * (n_out - 1) + (e,)


def _data_counts(send):
    data = np.asarray(send[0])
    if data.ndim == 0:
        raise InvalidInputError(f"data of send must be (n,) keys or (n, d) rows, got a scalar ({data.dtype})")
    return np.ascontiguousarray(data), send[1]


def _concat_blocks(send):
    """(data, counts): the blocks of ``exchange``'s list concatenated without any promotion (empty blocks
    take the dtype and trailing shape of the non-empty ones; non-empty ones must agree, else a typed
    error), and the rows of each."""
    blocks = [np.asarray(b) for b in send]
    for j, b in enumerate(blocks):
        if b.ndim == 0:
            raise InvalidInputError(f"block {j} of send is a scalar ({b.dtype}); pass (n,) keys or (n, d) rows, "
                                    "e.g. np.array([x])")
    full = [(j, b) for j, b in enumerate(blocks) if len(b)]
    j0, ref = full[0] if full else (0, blocks[0])
    for j, b in full:
        if b.dtype != ref.dtype:
            raise InvalidTypeError(f"blocks of send must share one dtype: block {j0} is {ref.dtype}, block {j} "
                                   f"is {b.dtype}; cast them (empty blocks take the others' dtype)")
        if b.shape[1:] != ref.shape[1:]:
            raise InvalidInputError(f"blocks of send must share one trailing shape: block {j0} has rows of "
                                    f"shape {ref.shape[1:]}, block {j} of shape {b.shape[1:]}")
    out = np.empty((sum(len(b) for _, b in full),) + ref.shape[1:], dtype=ref.dtype)
    at = 0
    for _, b in full:
        out[at:at + len(b)] = b
        at += len(b)
    return out, np.array([len(b) for b in blocks], dtype=np.int64)


def exchange(comm, send, stats=None, kind: str = SPARSE_PULL, waiter=SPIN):
    """Alltoallv of variable-size blocks of keys (n,) uint64 or rows (n, d) over ``comm``. Collective.

    send is either a *list* of ``comm.size`` host arrays (block j goes to rank j), giving a list of the
    blocks received from each rank, or a *tuple* ``(data, counts)`` (data grouped by destination,
    counts (size,) int rows per destination), giving ``(received data, received counts)`` grouped by
    source rank. Every block of a list has one dtype and trailing shape (an empty block, e.g.
    ``np.empty(0)``, takes those of the others; non-empty ones that differ raise InvalidTypeError /
    InvalidInputError). REQUIRES the same dtype and trailing shape on every rank, also on a rank with only
    empty blocks (pass ``np.empty((0, d), dtype=rows.dtype)``): every rank raises InvalidTypeError when they
    differ, before any data moves. Bytes sent to other ranks go to ``stats`` under ``kind``. MPI calls wait as
    ``waiter`` says (``_wait.Waiter``, here and in :func:`pull_remote`, :func:`push_to_owners`; default: spin).
    """
    if kind not in KINDS:
        raise InvalidInputError(f"unknown traffic kind {kind!r}; expected one of {KINDS}")
    size = comm.Get_size()
    as_list = isinstance(send, list)
    if as_list and len(send) != size:
        raise InvalidInputError(f"send must have one block per rank ({size}), got {len(send)}")
    if not as_list and not (isinstance(send, tuple) and len(send) == 2):
        raise InvalidInputError("send must be a list of comm.size arrays or a tuple (data, counts)")
    data, counts, error = _checked(_concat_blocks if as_list else _data_counts, send)
    with metered(stats, kind) as meter:
        out, recv_counts = _alltoallv(comm, data, counts, meter, waiter, error)
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
    ranks) go to ``stats`` under ``"sparse_pull"``. Invalid keys, owner or serve_fn result on one rank
    raise a typed error there and InvalidInputError on the others (no rank hangs).
    """
    def ask():
        k = as_keys(keys)
        order, counts = _group_by_owner(comm, k, owner)
        return k[order], counts, order

    send, counts, order, error = _checked(ask, n_out=3)
    with metered(stats, SPARSE_PULL) as meter:
        asked, asked_counts = _alltoallv(comm, send, counts, meter, waiter, error)
        served, error = _checked(lambda: (_as_rows(serve_fn(asked), asked.shape[0], "serve_fn's result"),), n_out=1)
        got, got_counts = _alltoallv(comm, served, asked_counts, meter, waiter, error)
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
    rank. Bytes sent to other ranks go to ``stats`` under ``"owner_writeback"``. Invalid keys, rows or
    owner on one rank raise a typed error there and InvalidInputError on the others (no rank hangs).
    """
    def grouped():
        k = as_keys(keys)
        r = _as_rows(rows, k.shape[0], "rows")
        order, counts = _group_by_owner(comm, k, owner)
        return k[order], counts, r[order]

    send_keys, counts, send_rows, error = _checked(grouped, n_out=3)
    with metered(stats, OWNER_WRITEBACK) as meter:
        in_keys, _ = _alltoallv(comm, send_keys, counts, meter, waiter, error)
        in_rows, _ = _alltoallv(comm, send_rows, counts, meter, waiter)
    return apply_fn(in_keys, in_rows)
