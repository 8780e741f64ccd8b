"""The first run: kernels compile in a warm-up before the timed training, which then compiles nothing;
the user is told while it happens."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hps.config import Config
from hps.train import Trainer, _warmup
from tests.budgets import spill_budget

# In a fresh process (no kernel loaded yet): warm up, then count the Numba specialisations the timed
# training and evaluation add — compiled or loaded from the cache, each would count into examples/s.
SCRIPT = textwrap.dedent("""
    import json, sys
    from numba.core.dispatcher import Dispatcher
    from hps.config import Config
    from hps.train import Trainer, _warmup

    def specialisations():
        return {f"{name}.{k}": len(v.overloads) for name, mod in list(sys.modules.items())
                if name.startswith("hps") and mod is not None
                for k, v in vars(mod).items() if isinstance(v, Dispatcher)}

    t = Trainer(Config.from_flat(json.loads(sys.argv[1])))
    try:
        _warmup.warm_up(t, print)
        before = specialisations()
        m = t.fit(warm_up=False)
        t.evaluate()
        after = specialisations()
    finally:
        t.close()
    new = {k: [before.get(k, 0), n] for k, n in after.items() if n != before.get(k, 0)}
    print(json.dumps({"new": new, "ssd_bytes_read": m["ssd_bytes_read"]}))
""")

SMALL = dict(rows=12000, fields=4, vocab_per_field=3000, batch_size=2048, minibatch_size=256, hidden=[16, 8],
             embedding_dim=8, progress=False)


def _libsvm(path, n=3000):
    lines = [f"{i % 2} " + " ".join(f"{f * 1000 + (i * 7 + f) % 300}:1" for f in range(4)) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("case", ["in-memory", "spilling-with-checkpoints"])
def test_the_timed_training_compiles_nothing(tmp_path, case):
    flat = dict(SMALL)
    if case != "in-memory":  # rows leave MEM-PS for SSD-PS and come back; a file reader; checkpoints
        for synthetic_only in ("rows", "fields", "vocab_per_field"):
            del flat[synthetic_only]
        flat.update(format="libsvm", data=_libsvm(tmp_path / "train.libfm"), eval_data=str(tmp_path / "train.libfm"),
                    batch_size=128, minibatch_size=32, rows_per_file=64)
        flat.update(mem_budget=spill_budget(flat, 600), checkpoint_dir=str(tmp_path / "ck"), checkpoint_every=2)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(flat)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["new"] == {}  # kernel -> [specialisations before, after], if any
    assert (out["ssd_bytes_read"] > 0) == (case != "in-memory")


def test_a_slow_warm_up_says_it_is_compiling(monkeypatch):
    monkeypatch.setattr(_warmup, "COMPILE_NOTICE_S", 0.0)  # as if compiling took longer than the threshold
    lines = []
    t = Trainer(Config.from_flat(dict(SMALL, rows=600, batch_size=300, minibatch_size=100)))
    try:
        seconds = _warmup.warm_up(t, lines.append)
    finally:
        t.close()
    assert seconds > 0
    assert lines[0].startswith("hps: compiling kernels (first run only")
    assert lines[1].startswith("hps: kernels ready after")


def test_the_warm_up_leaves_the_job_untouched(tmp_path):
    """The scratch job has its own tiers: the real one starts from nothing and ends as without it."""
    flat = dict(SMALL, rows=4096, batch_size=1024, minibatch_size=256)
    a = Trainer(Config.from_flat(flat))
    b = Trainer(Config.from_flat(flat))
    try:
        ma = a.fit(warm_up=True)
        assert ma["warmup_seconds"] > 0
        mb = b.fit(warm_up=False)
        assert ma["loss_per_batch"] == mb["loss_per_batch"] and ma["table_rows"] == mb["table_rows"]
        assert a.evaluate() == b.evaluate()
    finally:
        a.close()
        b.close()


def test_the_scratch_job_is_the_jobs_own_warm_up_form(tmp_path):
    """Every option says what the warm-up does with it (``hps.config.WARMUP``): what writes, reads or
    profiles anything of the real job's is off, the sizes are the scratch's, every other option — the
    model, the tiers' shape, the features that change which kernels run — is the job's own."""
    from dataclasses import fields

    from hps.config import SECTIONS, WARMUP, Scratch, scratch_config

    job = Config.from_flat(dict(SMALL, eval_data=None, checkpoint_dir=str(tmp_path), checkpoint_every=3, resume=True,
                                export=str(tmp_path / "e"), metrics_out=str(tmp_path / "m.json"),
                                plots=str(tmp_path / "p"), eval_every=2, early_stop=1, fae="auto", hot_bytes="4k",
                                ssd_path=str(tmp_path / "ssd"), keep_ssd=True, hbm_capacity=999, epochs=3, hbm_budget="1GiB",
                                expire_after=4, lr_decay="cosine", lr_decay_steps=5,
                                dense_sync="easgd", groups=2, model="dcn", sparse_optimizer="adam"))
    scratch = scratch_config(job, Scratch(examples=32, mem_budget=12345, hbm_budget=6789))
    t, s = scratch.train, scratch.tiers
    assert (t.checkpoint_dir, t.checkpoint_every, t.resume, t.export, t.metrics_out, t.plots) == (None, 0, False,
                                                                                                   None, None, None)
    assert (t.eval_every, t.early_stop, t.fae, t.hot_bytes, t.progress, t.epochs) == (0, 0, None, None, False, 1)
    assert (t.batch_size, t.minibatch_size, s.mem_budget, s.hbm_budget) == (32, 16, 12345, 6789)
    assert (s.ssd_path, s.keep_ssd, s.hbm_capacity, scratch.data.eval_data) == (None, False, None, None)
    for name in SECTIONS:  # the rest is the job's
        for f in fields(getattr(job, name)):
            if WARMUP not in f.metadata:
                assert getattr(getattr(scratch, name), f.name) == getattr(getattr(job, name), f.name), f.name



def _first_batch_alive(warm_up: bool) -> list[bool]:
    """Whether the arrays owning the first batch's keys, labels and dense values are still alive once the
    trainer has dropped the batch (as ``fit`` does), with the collector off as between two full collections."""
    import gc
    import weakref

    t = Trainer(Config.from_flat(dict(SMALL, rows=4096, batch_size=1024, minibatch_size=256)))
    owners = []
    for a in (t.first_batch.keys, t.first_batch.labels, t.first_batch.dense):
        while isinstance(a.base, np.ndarray):
            a = a.base
        owners.append(weakref.ref(a))
    gc.disable()
    try:
        if warm_up:
            _warmup.warm_up(t, lambda line: None)
        t.first_batch = None
        return [r() is not None for r in owners]
    finally:
        gc.enable()
        t.close()


def test_the_warm_up_keeps_nothing_of_the_first_batch_alive():
    """The scratch job's objects hold reference cycles that only a full collection frees: it trains on
    copies of the first batch's examples, not views, so the batch's memory goes when ``fit`` drops it."""
    without = _first_batch_alive(warm_up=False)
    assert without[0] is False  # the keys are the batch's own (the synthetic reader's dense may be shared)
    assert _first_batch_alive(warm_up=True) == without
