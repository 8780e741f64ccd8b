"""``--shuffle-buffer N``: a seeded streaming shuffle of each data shard.

Each shard's stream of batches (``batch_size`` examples, the last one shorter) passes through a
buffer: incoming examples join it, and once it holds more than N examples beyond one batch, a batch
of ``batch_size`` examples drawn uniformly from it, without replacement, goes out; at the end of
the stream the rest goes out the same way. So the shard yields the same examples in the same
numbers of batches of the same sizes, in an order that depends only on (``--seed``, shard, epoch)
and the shard's data: the same for a given ``--data-shards`` whatever the number of ranks (a shard
is read by one rank), each epoch another order, and the same again under ``--resume`` (which reads
the data from the start and skips the batches trained). Memory: N + 2 batches of examples per shard.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..data import Batch

#: Random stream of the shuffle (mixed with the seed, shard and epoch; never renumber).
SHUFFLE_STREAM = 0x5EED_5A1F


def take(batch: Batch, idx: np.ndarray) -> Batch:
    """Examples ``idx`` (m,) int64 of ``batch``, in that order, as a new Batch (vectorised)."""
    lens = np.diff(batch.offsets)[idx]
    starts = batch.offsets[:-1][idx]
    offsets = np.zeros(idx.shape[0] + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    pos = np.repeat(starts - offsets[:-1], lens) + np.arange(offsets[-1], dtype=np.int64)
    return Batch(batch.labels[idx], batch.dense[idx], batch.keys[pos], batch.field[pos], batch.weights[pos],
                 offsets, batch.n_fields)


def shuffled(batches, buffer: int, seed: int, shard: int, epoch: int) -> Iterator[Batch]:
    """``batches`` (an iterator of Batches, all but the last of one size) shuffled through a buffer of
    ``buffer`` examples (see the module docstring). Closes ``batches`` when closed."""
    rng = np.random.default_rng([int(seed), SHUFFLE_STREAM, int(shard), int(epoch)])
    buf, size = None, None
    try:
        for b in batches:
            size = len(b) if size is None else size
            buf = b if buf is None else Batch.concat([buf, b])
            while len(buf) >= buffer + size:
                out, buf = _draw(buf, size, rng)
                yield out
        while buf is not None and len(buf):
            out, buf = _draw(buf, min(size, len(buf)), rng)
            yield out
    finally:
        getattr(batches, "close", lambda: None)()


def _draw(buf: Batch, n: int, rng) -> tuple[Batch, Batch]:
    """(n examples drawn from ``buf`` without replacement, the rest in their order)."""
    pick = rng.choice(len(buf), size=n, replace=False)
    keep = np.ones(len(buf), np.bool_)
    keep[pick] = False
    return take(buf, pick), take(buf, np.flatnonzero(keep))
