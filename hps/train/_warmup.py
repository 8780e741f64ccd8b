"""Warm-up: compile (or load from Numba's cache) a run's kernels before its timed training.

A fresh machine spends 15-30 s compiling the Numba kernels the first time they run; inside the
training that would freeze the progress bar at 0 % and count into examples/s. Instead
:func:`warm_up` runs a *scratch copy* of the job on a few tiny batches cut from the first real one
(``Trainer.first_batch``, which the trainer parsed for its memory plan, so the reader's kernels are
already compiled) — the same data types, device, model shape and optimizers, a MEM-PS cache that
spills, its own temporary SSD-PS — so the kernels a run uses are compiled (and cached on disk for later runs) before
the clock starts (``tests/test_warmup.py`` checks that the timed part adds no specialisation). The
scratch job runs in this process alone (its collectives are local; the kernels only ranks of an MPI
job run are compiled by ``Collectives.warm_up``), shares nothing with the real one and is removed
afterwards.

On ``--device cuda`` a second scratch job then trains the whole first batch once in the job's own
mini-batches: CuPy compiles some kernels per size class (the multi-block scans of the batch plans, the
reductions of the dense backward), which tiny batches never reach. An H200 run on a fresh machine
(2026-11-27) compiled ~6 s of them inside the timed training without it.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from .._index import warm_up as index_warm_up
from .._xp import simulated
from ..mem._init import warm_up as init_warm_up
from ..config import Scratch, scratch_config
from ._hbm_budget import hbm_budget_for
from ._collectives import Collectives
from ._feed import Feed

#: Examples per warm-up batch, and batches (more than the residency window, so rows leave HBM-PS,
#: spill from MEM-PS and come back from SSD-PS). Only the kernels' argument types matter, not sizes.
WARMUP_EXAMPLES = 32
WARMUP_BATCHES = 8
#: Say "compiling kernels" once the warm-up has taken this long (loading cached kernels is faster).
COMPILE_NOTICE_S = 2.0


def warm_up(trainer, log) -> float:
    """Compile ``trainer``'s kernels on a scratch copy of its job (see the module docstring);
    ``log(line)`` gets the notices. Reads ``trainer.first_batch`` and touches no state of ``trainer``.
    Blocking; local (no communication), so ranks may call it at different times. Returns the seconds it took."""
    t0 = time.perf_counter()
    noticed = threading.Event()

    def notice():
        noticed.set()
        log("hps: compiling kernels (first run only; cached for the next runs)...")

    timer = threading.Timer(COMPILE_NOTICE_S, notice)
    timer.daemon = True
    timer.start()
    try:
        first = trainer.first_batch  # this rank's first local batch, parsed for the memory plan
        if first is not None and len(first):
            _scratch_run(trainer, first)
            if trainer.cfg.tiers.device == "cuda" and not simulated():  # the simulator compiles nothing
                _full_size_run(trainer, first)
    finally:
        timer.cancel()
    seconds = time.perf_counter() - t0
    if noticed.is_set():
        log(f"hps: kernels ready after {seconds:.1f} s; training starts")
    return seconds


def _scratch_run(trainer, first) -> None:
    """Train a scratch job of the same configuration on tiny slices of ``first`` (a Batch)."""
    n = min(len(first), WARMUP_EXAMPLES * WARMUP_BATCHES)
    parts = [_own(first.slice(a, min(a + WARMUP_EXAMPLES, n))) for a in range(0, n, WARMUP_EXAMPLES)]
    scratch = _scratch_job(trainer, parts, WARMUP_EXAMPLES)
    try:
        scratch.fit(warm_up=False)
        scratch.hier.sync_to_store()   # a consistent cut, as checkpoints take: the table's export
        index_warm_up()                # the SSD-PS index's growth, which the scratch table never reaches
        init_warm_up()                 # the ordering of a large array's new rows (the CPU twin's)
        scratch.evaluate(parts[:1])
        trainer.coll.warm_up(parts[0].keys, trainer.row_params)  # all-reduces carry row gradients
    finally:
        scratch.close()


def _full_size_run(trainer, first) -> None:
    """Train a scratch job on the whole first batch once, in this rank's largest mini-batch, with room
    for its working set in HBM-PS (see the module docstring)."""
    scratch = _scratch_job(trainer, [_own(first)], len(first), int(trainer.feed.local_minibatch_sizes.max()))
    try:
        scratch.fit(warm_up=False)
    finally:
        scratch.close()


def _scratch_job(trainer, parts, examples: int, minibatch: int | None = None):
    """A scratch Trainer replaying ``parts`` (Batches) in batches of ``examples`` and mini-batches of
    ``minibatch`` (None: the warm-up form's, ``hps._options._scratch_minibatch``): the job's own
    configuration in its warm-up form (each option declares it: hps.config.WARMUP) with the job's budget
    (its plan holds the scratch job's smaller shares), an HBM-PS cache of two batches' working sets (rows
    leave it for the MEM-PS when the parts are more) and below, a MEM-PS cache of one batch's working set:
    later batches spill to SSD-PS and load back."""
    working_set = max(int(np.unique(p.keys).shape[0]) for p in parts)
    hbm = hbm_budget_for(2 * working_set, trainer.row_width)
    scratch_cfg = scratch_config(trainer.cfg, Scratch(examples, trainer.plan.budget, hbm, minibatch))
    feed = Feed.replay(parts, trainer.feed.n_fields, trainer.feed.n_dense, scratch_cfg.train.minibatch_size)
    return type(trainer)(scratch_cfg, Collectives(), log=lambda *a, **k: None, feed=feed, cache_rows=working_set)


def _own(part):
    """``part`` (a Batch of views into the first batch) with copies of its arrays. The scratch job's
    objects hold reference cycles (a trainer and its pipeline's bound methods), freed only by the next
    full collection of the garbage collector: with views they would keep the whole first batch (tens
    of MB) alive for as long, after ``fit`` has dropped it. The copies have the views' dtypes and
    layout (C-contiguous), so the kernels see the same types."""
    return dataclasses.replace(part, **{f.name: getattr(part, f.name).copy() for f in dataclasses.fields(part)
                                        if isinstance(getattr(part, f.name), np.ndarray)})
