"""``bench.train_scaling``'s own arithmetic (the sweep itself runs as ``python -m bench.bench_train scaling``)."""

import math
from pathlib import Path

from bench.train_scaling import minibatches


def test_minibatches_counts_every_batch_and_its_short_last_minibatch():
    assert minibatches(200_000, 16_384, 2_048) == 98      # 12 full batches of 8, then 3,392 examples: 2
    assert minibatches(16_384 * 3, 16_384, 2_048) == 24   # no short batch
    assert minibatches(1_000, 16_384, 2_048) == 1         # one short batch, one short mini-batch
    assert minibatches(10, 4, 3) == 2 * 2 + 1             # batches of 4 cut 3 + 1; the last 2 examples: 1
    assert minibatches(0, 16_384, 2_048) == 0
    for n in (1, 99, 4095, 4096, 4097):                   # a batch a whole number of mini-batches: ceil
        assert minibatches(n, 4096, 512) == math.ceil(n / 512)


def test_rank_time_pins_the_child_and_writes_its_times(tmp_path):
    """``bench.rank_time`` (each rank of ``bench_train scaling``): the child runs on rank 0's CPUs and its
    wall, user, sys seconds and peak RSS land in ``OUT.0``; the child's exit status is returned."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "OMPI_COMM_WORLD_RANK")}
    env["PYTHONPATH"] = str(root)
    child = "import os, sys; print(sorted(os.sched_getaffinity(0))); sum(range(10**6)); sys.exit(3)"
    proc = subprocess.run([sys.executable, "-m", "bench.rank_time", str(tmp_path / "t"), "1", "--",
                           sys.executable, "-c", child], capture_output=True, text=True, env=env, cwd=root)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.strip() == str(sorted(os.sched_getaffinity(0))[:1])
    wall, user, sys_, rss = (tmp_path / "t.0").read_text().split()
    assert float(wall) > 0 and float(user) + float(sys_) > 0 and int(rss) > 1000
