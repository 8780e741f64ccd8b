"""The feed: one process reading K shards composes exactly the global mini-batches K ranks train on."""

import numpy as np
import pytest

from hps.config import Config
from hps.data import Batch
from hps.errors import InvalidInputError
from hps.train._feed import Feed, minibatch_sizes, shard_minibatch_sizes
from tests.test_data_criteo import _assert_same, _random_lines


def _uneven_file(path, n=700):
    """Shards of very different line counts: a folder of four files (a whole file per shard of 4) of
    n/2, n/4, n/8 and n/8 lines, short lines first (byte ranges of one file hold about as many lines
    each, ``hps.data._shards``)."""
    lines = _random_lines(np.random.default_rng(8), n)
    for i in range(n // 2):
        cols = lines[i].split("\t")
        lines[i] = "\t".join(cols[:1] + [""] * 13 + cols[14:18] + [""] * 22)
    path.mkdir()
    ends = [0, n // 2, n // 2 + n // 4, n - n // 8, n]
    for f, (a, b) in enumerate(zip(ends, ends[1:])):
        (path / f"part{f}.txt").write_text("\n".join(lines[a:b]) + "\n")
    return path


def test_sizes_of_the_shards_add_up_to_the_global_minibatches():
    sizes = minibatch_sizes(1000, 300)
    assert sizes.tolist() == [300, 300, 300, 100]
    parts = np.stack([shard_minibatch_sizes(sizes, s, 7) for s in range(7)])
    assert (parts.sum(axis=0) == sizes).all() and (parts.max(axis=0) - parts.min(axis=0) <= 1).all()


@pytest.mark.parametrize("data", ["synthetic", "criteo"])
def test_one_process_with_k_shards_composes_what_k_ranks_read(tmp_path, data):
    flat = dict(batch_size=200, minibatch_size=64, data_shards=4)
    if data == "synthetic":
        flat.update(rows=1500, fields=3, vocab_per_field=50)
    else:
        flat.update(format="criteo", data=str(_uneven_file(tmp_path / "d")))
    cfg = Config.from_flat(flat)
    one = list(Feed(cfg, 0, 1).epoch())
    ranks = [list(Feed(cfg, r, 4).epoch()) for r in range(4)]
    counts = [len(r) for r in ranks]
    assert len(one) == max(counts)
    if data == "criteo":
        assert min(counts) < max(counts)  # the shards really are uneven
    total = 0
    for i, local in enumerate(one):
        assert local.counts.sum() <= 200
        for j in range(len(local.bounds) - 1):
            parts = [r[i].minibatch(j) for r in ranks if i < len(r)]
            parts = [p for p in parts if len(p)]
            if parts:
                _assert_same(local.minibatch(j), Batch.concat(parts))
            else:
                assert len(local.minibatch(j)) == 0
        total += int(local.counts.sum())
    assert total == (1500 if data == "synthetic" else 700)


def test_two_shards_per_rank_are_interleaved_minibatch_by_minibatch(tmp_path):
    cfg = Config.from_flat(dict(rows=1000, fields=2, vocab_per_field=30, batch_size=200, minibatch_size=50,
                                data_shards=4))
    one = next(Feed(cfg, 0, 1).epoch())
    halves = [next(Feed(cfg, r, 2).epoch()) for r in range(2)]
    for j in range(4):
        _assert_same(one.minibatch(j), Batch.concat([h.minibatch(j) for h in halves]))


@pytest.mark.parametrize("flat, message", [
    (dict(data_shards=3), "multiple of the number of ranks"),
    (dict(data_shards=8, minibatch_size=4, batch_size=8), "more than the mini-batch size"),
])
def test_bad_shard_counts_are_one_clear_error(flat, message):
    with pytest.raises(InvalidInputError, match=message):
        Feed(Config.from_flat(dict(rows=100, **flat)), 0, 2)
