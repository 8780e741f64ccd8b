"""``bench.train_scaling``'s own arithmetic (the sweep itself runs as ``python -m bench.bench_train scaling``)."""

import math

from bench.train_scaling import minibatches


def test_minibatches_counts_every_batch_and_its_short_last_minibatch():
    assert minibatches(200_000, 16_384, 2_048) == 98      # 12 full batches of 8, then 3,392 examples: 2
    assert minibatches(16_384 * 3, 16_384, 2_048) == 24   # no short batch
    assert minibatches(1_000, 16_384, 2_048) == 1         # one short batch, one short mini-batch
    assert minibatches(10, 4, 3) == 2 * 2 + 1             # batches of 4 cut 3 + 1; the last 2 examples: 1
    assert minibatches(0, 16_384, 2_048) == 0
    for n in (1, 99, 4095, 4096, 4097):                   # a batch a whole number of mini-batches: ceil
        assert minibatches(n, 4096, 512) == math.ceil(n / 512)
