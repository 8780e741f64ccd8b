"""``hps.train``'s parameter hierarchy and train step as a library, without the CLI or a ``Config``: the
tiers (HBM-PS table over MEM-PS over a store), residency (``ParameterHierarchy``), a sparse and a dense
sync strategy and the CPU backend are built by hand and composed; one mini-batch through them equals
the model's own forward/backward and optimizer steps. And a feature written outside ``hps`` plugs into
the trainer's pipeline through the hooks alone (``_features``)."""

import numpy as np
import pytest

from hps.config import Config
from hps.data import Batch
from hps.mem import MemPS, RowInitializer
from hps.model import ModelConfig, make_model, make_optimizers
from hps.table import HashTable
from hps.train import DenseSync, Feature, HostBackend, OwnerSync, ParameterHierarchy, ReplicaSync, Trainer
from hps.train._collectives import Collectives
from hps.train._feed import LocalBatch
from hps.train._hierarchy import WINDOW
from hps.train._hot_rows import HotRows
from hps.train._sync import unique_inverse
from tests.reference.store import DictStore


def _batch(n=12, fields=3, vocab=7, seed=0):
    rng = np.random.default_rng(seed)
    keys = (rng.integers(0, vocab, size=n * fields) + 1000 * np.tile(np.arange(fields), n)).astype(np.uint64)
    return Batch(rng.integers(0, 2, n).astype(np.float32), rng.standard_normal((n, 2)).astype(np.float32), keys,
                 np.tile(np.arange(fields, dtype=np.int32), n), np.ones(n * fields, np.float32),
                 np.arange(0, n * fields + 1, fields, dtype=np.int64), fields)


@pytest.mark.parametrize("sync_cls", [OwnerSync, ReplicaSync])
def test_the_hierarchy_and_the_step_compose_without_a_config(sync_cls):
    mcfg = ModelConfig(n_fields=3, emb_dim=4, n_dense=2, hidden=(8,), seed=1, sparse_lr=0.1)
    model, (sparse, dense) = make_model(mcfg), make_optimizers(mcfg)
    ref_model, (ref_sparse, ref_dense) = make_model(mcfg), make_optimizers(mcfg)  # the same seeded init
    P = model.row_params
    W = sparse.row_width(P)
    init = RowInitializer(P, W, seed=1)
    coll, be = Collectives(), HostBackend(model)
    sync = sync_cls(coll, sparse, P, HotRows(sparse, P, W, be))
    dense_sync = DenseSync(coll, model.params, dense, be)
    memps = MemPS(DictStore(W), W, capacity_rows=64, initializer=init)
    hier = ParameterHierarchy(HashTable(64, W), memps, WINDOW, coll.owned_mask)
    batch = _batch()
    local = LocalBatch(batch, np.array([0, len(batch)], np.int64))
    resident, plans = sync.plan(local)                  # prepare: who needs which rows
    hier.prepare(0, resident)                          # fetch them into the HBM-PS
    staged = be.stage(local, plans, hier.hbm)          # place: the step's inputs
    be.begin_batch(hier.hbm)
    grads = sync.step(be, hier.hbm, plans[0], staged[0], len(batch))   # train: the sparse step
    dense_sync.step(grads, len(batch), len(batch))                         # and the dense one
    loss = be.end_batch(hier.hbm)
    # the same mini-batch, straight through the model and the optimizers
    keys, inv = unique_inverse(batch.keys)
    rows = init(keys)
    want_loss, _, g_rows, g_dense = ref_model.forward_backward(rows[:, :P], inv, batch)
    np.testing.assert_array_equal(hier.hbm.get(keys)[0], ref_sparse.apply(rows, g_rows))
    ref_dense.step(ref_model.params, g_dense)
    for name, p in model.params.items():
        np.testing.assert_array_equal(p, ref_model.params[name])
    assert loss == want_loss * len(batch)


class _Recorder(Feature):
    """A feature from outside ``hps``: records the hooks the pipeline calls, in order."""

    name = "recorder"

    def __init__(self):
        self.calls = []

    def start(self, job):
        self.calls.append(("start", job.resumed))

    def on_read(self, w, ch):
        self.calls.append(("read", w.index))

    def on_prepare(self, w):
        self.calls.append(("prepare", w.index))

    def before_minibatch(self, w, j):
        self.calls.append(("minibatch", w.index, j))

    def after_batch(self, w, job):
        self.calls.append(("trained", w.index))

    def finish(self):
        self.calls.append(("finish",))

    def rank_metrics(self):
        return len(self.calls)

    def metrics(self, per_rank):
        return {"recorded": per_rank}


def test_a_feature_from_outside_plugs_in_through_the_hooks():
    cfg = Config.from_flat(dict(rows=600, fields=3, vocab_per_field=50, batch_size=200, minibatch_size=100,
                                hidden=[4], embedding_dim=4, progress=False))
    t = Trainer(cfg, log=lambda *a, **k: None)
    try:
        rec = _Recorder()
        t.features.all.append(rec)
        m = t.fit(warm_up=False)
    finally:
        t.close()
    per_stage = {stage: [c for c in rec.calls if c[0] == stage] for stage in ("read", "prepare", "trained")}
    assert per_stage["read"] == [("read", i) for i in range(3)]
    assert per_stage["prepare"] == [("prepare", i) for i in range(3)]
    assert per_stage["trained"] == [("trained", i) for i in range(3)]
    assert [c for c in rec.calls if c[0] == "minibatch"] == [("minibatch", i, j) for i in range(3) for j in range(2)]
    assert rec.calls[0] == ("start", None) and rec.calls[-1] == ("finish",)
    assert m["recorded"] == [len(rec.calls)] and m["examples"] == 600


def test_every_backend_begins_a_batch_with_nothing_staged_alike():
    """``begin_batch``'s ``staged`` defaults to None in the protocol and in both backends (the device
    one reads ``staged.ready`` of anything else, so a ``()`` default would raise there)."""
    import inspect

    from hps.train._backend import Backend
    from hps.train._device_backend import DeviceBackend

    defaults = {c.__name__: inspect.signature(c.begin_batch).parameters["staged"].default
                for c in (Backend, HostBackend, DeviceBackend)}
    assert defaults == {"Backend": None, "HostBackend": None, "DeviceBackend": None}


def test_the_dense_shard_refuses_arrays_it_cannot_write_in_place():
    """The dense shard writes the stepped blocks through flat views of the parameters: an array that is
    not C-contiguous (whose ``reshape(-1)`` is a copy, so the write would be lost on this rank alone) is
    refused where the arrays are taken, at construction and after a load, never in a mini-batch's
    collective."""
    from hps.errors import InternalError
    from hps.model._dense_optim import DenseSGD
    from hps.train._dense_shard import DenseShard

    params = {"w": np.zeros((3, 4), np.float32), "b": np.zeros(4, np.float32)}
    shard = DenseShard(params, DenseSGD(0.1), 2, 0)
    shard.scatter(params)  # C-contiguous: taken
    params["w"] = np.zeros((4, 3), np.float32).T  # a load that gave a transposed array
    with pytest.raises(InternalError, match="'w' is not C-contiguous"):
        shard.scatter(params)
    with pytest.raises(InternalError, match="'w' is not C-contiguous"):
        DenseShard(params, DenseSGD(0.1), 2, 1)
