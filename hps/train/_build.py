"""The composition root of a training job: the train step's strategies and the features, each built from
its own options (TorchRec's way: the pieces are built and passed in; ``Trainer`` only wires them into
the pipeline). Library users may build the pieces themselves (``_backend``, ``_sync``, ``_dense_sync``,
``_hierarchy``) without a ``Config``: these functions are what the command line's job does with one.
"""

from __future__ import annotations

from ..errors import InvalidInputError
from ..gpu import Placement
from ._admission import FeatureFilter, NoFeatureFilter
from ._backend import HostBackend
from ._control import TrainingControl, best_dir, run_name
from ._control_feature import ControlFeature
from ._easgd import make_dense_sync
from ._fae import FaeFeature, FaeOptions
from ._features import Features
from ._het import cache_entries
from ._het_sync import HetSync
from ._hierarchy import WINDOW
from ._hot_rows import HotRows
from ._schedule import LRSchedule
from ._sync import SYNCS


def backend(tiers, model, xp, coll):
    """The train step's backend: NumPy and the CPU kernels, or the HBM-PS on the GPU (``--device cuda``;
    with ``--n-parts`` > 1 the parts spread over ``--gpus`` GPUs, as ``make_hbm`` places them).
    Collective over ``coll.main`` on the GPU with several ranks."""
    if tiers.device == "cpu":
        return HostBackend(model)
    from ._device_backend import DeviceBackend  # here: a CPU job never imports numba-cuda's kernels

    placement = Placement(tiers.n_parts, tiers.gpus) if tiers.n_parts > 1 else None
    return DeviceBackend(model, xp, coll, placement)


def step_strategies(tc, data, coll, be, sparse_opt, dense_opt, params: dict, row_params: int, row_width: int):
    """(FAE's hot rows, the sparse sync, the dense sync) of the TrainConfig ``tc``: what the train step
    runs with (``be``: its backend; ``params``: the model's dense parameters). The hot rows' all-reduce
    rides in the dense one when that one is a plain all-reduce of all ranks. A ``--het-cache`` fraction
    is of the synthetic vocabulary (``data``: fields x values per field); other data needs a size in
    bytes. Collective over ``coll.main`` (EASGD's group communicators)."""
    fused = coll.size > 1 and tc.dense_sync == "allreduce" and tc.compress == "none"
    hot = HotRows(sparse_opt, row_params, row_width, be, fused=fused)
    dense = make_dense_sync(tc.dense_sync, coll, params, dense_opt, be, compress=tc.compress, groups=tc.groups,
                            alpha=tc.easgd_alpha, every=tc.easgd_every)
    if fused:
        dense.add_rider(hot)
    if tc.consistency == "het":
        table = data.fields * data.vocab_per_field if data.format == "synthetic" else None
        sync = HetSync(coll, sparse_opt, row_params, hot, row_width=row_width,
                       capacity=cache_entries(tc.het_cache, row_width, row_params, table),
                       staleness=tc.staleness, policy=tc.het_policy, window=WINDOW,
                       checkpoint_every=tc.checkpoint_every)
    else:
        sync = SYNCS[tc.sparse_sync](coll, sparse_opt, row_params, hot, compress=dense.compress)
        sync.dense = dense  # the dense gradients' reduction starts before the sparse exchange
    return hot, sync, dense


def features(cfg, coll, feed, sync, dense, hot, opts, row_width: int, predict, log) -> Features:
    """The job's features, in the order their hooks run: the sparse and the dense sync, admission and
    expiry, FAE, the learning-rate schedule, training control. ``opts``: the sparse and the dense
    optimizer (the schedule sets their rates); ``predict(rows, inv, batch) -> probs``: FAE's held-out
    loss. Raises InvalidInputError for ``--eval-every`` without eval data."""
    tc = cfg.train
    out = [sync, dense]
    if tc.admit_after > 1 or tc.expire_after:
        out.append(FeatureFilter(coll, tc.admit_after, tc.expire_after, tc.admit_sketch_width, window=WINDOW))
    else:   # a resume refuses a checkpoint with admission/expiry state, as that feature refuses one without
        out.append(NoFeatureFilter())
    if tc.fae is not None:
        fae = FaeOptions(tc.fae, tc.hot_bytes, tc.fae_sample_rate, tc.fae_holdout, tc.minibatch_size, tc.seed,
                         tc.batch_size)
        out.append(FaeFeature(hot, fae, cfg.data, coll, row_width, feed.n_fields, feed.n_dense, feed.has_eval,
                              feed.eval_options, predict, log))
    schedule = LRSchedule(tc.lr_warmup, tc.lr_decay, tc.lr_decay_steps, len(feed.sizes), opts)
    if schedule.active:
        out.append(schedule)
    if tc.eval_every and not feed.has_eval:
        raise InvalidInputError(f"--eval-every needs eval data: give --eval-data FILE (--format {cfg.data.format})")
    control = TrainingControl(tc.eval_every, tc.early_stop, WINDOW, best_dir(tc))
    out.append(ControlFeature(control, run_name(cfg), writes_latest=coll.rank == 0))
    return Features(out)
