"""``python -m hps.train --device cuda`` on Numba's CUDA simulator: the GPU-resident step of
``hps/train/_device_backend.py`` (rows stay in the HBM-PS, pooling, gradient reduction and the row
optimizers run as CUDA kernels on the table's rows) with NumPy standing in for CuPy (``hps._xp``).

Each job ends with the CPU backend's parameters (max abs diff <= 1e-5 over hps.load_export) and AUC,
and the transfer ledger shows what crossed: no row, key or gradient inside the mini-batch loop (16
bytes per batch, the loss and the missing-key count), every row fetched into the HBM-PS once and
written back once. Tiny on purpose: the simulator runs every kernel thread in Python.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hps.train import load_export, main

pytestmark = pytest.mark.cudasim

REPO = Path(__file__).resolve().parents[2]
#: an HBM-PS of 128 keys at first holds these tables (at most 120 keys; later flags override it): the
#: default first size, 1,024 keys, made each end-of-training write-down rank 2,048 slots on the simulator
TINY = ["--rows", "300", "--fields", "2", "--vocab-per-field", "40", "--batch-size", "100",
        "--minibatch-size", "50", "--hidden", "4", "--embedding-dim", "3", "--no-progress", "--hbm-capacity", "128"]
#: model and row-optimizer combinations (every row kernel, first-order columns, L2, an HBM-PS that must
#: grow from 8 keys) -> (arguments, floats per row: parameters P (3, or 4 with a first-order weight)
#: and the optimizer's state)
CASES = {
    "ctr-adagrad": ([], 3 + 3),
    "wdl-rowwise-adagrad-l2": (["--model", "wdl", "--sparse-optimizer", "rowwise-adagrad", "--emb-l2", "0.01"],
                               4 + 1),
    "deepfm-adam-growth": (["--model", "deepfm", "--sparse-optimizer", "adam", "--hbm-capacity", "8"], 4 + 9),
    "dcn-sgd-allreduce": (["--model", "dcn", "--sparse-optimizer", "sgd", "--sparse-sync", "allreduce"], 3),
}


def run(tmp_path, device, extra=()):
    out, metrics = tmp_path / device, tmp_path / f"{device}.json"
    assert main([*TINY, *extra, "--device", device, "--export", str(out), "--metrics-out", str(metrics)]) == 0
    return load_export(out, first_order=True), json.loads(metrics.read_text())


def assert_same_model(cpu_export, gpu_export):
    """Keys equal; embeddings, first-order weights (wdl, deepfm) and dense parameters within 1e-5."""
    kc, vc, dc, fc = cpu_export
    kg, vg, dg, fg = gpu_export
    oc, og = np.argsort(kc), np.argsort(kg)
    np.testing.assert_array_equal(kc[oc], kg[og])
    assert np.abs(vc[oc] - vg[og]).max() <= 1e-5
    assert (fc is None) == (fg is None)
    if fc is not None:
        assert np.abs(fc[oc] - fg[og]).max() <= 1e-5
    for name in dc:
        assert np.abs(dc[name] - dg[name]).max() <= 1e-5, name


def assert_ledger(m, width, batches, ranks=1, fetched=None, written=None, n_parts=1):
    """No row, key or gradient crosses inside the mini-batch loop; rows cross only entering the HBM-PS
    and leaving it. Entering: ``fetched`` of them (the metric ``hbm_fetched_rows``, over all ranks, if
    given); one table makes the rows of keys new to every tier on the device (``hbm_born_rows``: nothing
    crosses for them) and the others go up (4 B a float, with their positions among the misses, 8 B, in
    a batch where some rows were born; the keys are the misses its lookup left on the device), a
    partitioned table's parts upload every row with its key. Leaving (``written``: default every fetched
    row once, as there are no checkpoints in these jobs): evictions and the end's export, keys and rows.
    Each batch's residency lookup brings only its misses down (``plan``, 8 B a key fetched); its working
    set's keys go up with the plans unless they were deduplicated on the device. With ``n_parts`` parts,
    partitioning a mini-batch's keys, and a batch's working set for its lookup, on the device brings
    n_parts counts to the host each (the misses' lookup once inserted partitions nothing). On one rank
    the host uploads nothing but rows beyond 1.25x the raw batch bytes."""
    h2d, d2h = m["h2d_bytes"], m["d2h_bytes"]
    assert h2d["minibatch"] == 0
    assert d2h["minibatch"] == 16 * batches * ranks <= 16 * m["minibatches"] * ranks
    assert h2d["plan"] > 0 and d2h["fetch"] == 0
    k, born = m["hbm_fetched_rows"], m["hbm_born_rows"]
    assert fetched in (None, k) and k > 0
    lookups = (d2h["plan"] - (8 * n_parts * (m["minibatches"] + batches) * ranks if n_parts > 1 else 0)
               - plan_offsets(m))
    assert lookups == 8 * k and h2d["plan"] > lookups          # only the misses came down (+ the plans up)
    row = 4 * width
    if n_parts > 1:  # the parts take host rows with their keys: nothing is born on the device
        assert born == 0 and h2d["fetch"] == k * (8 + row)
    else:            # born rows cross nothing; the others cross with their positions at most
        assert (k - born) * row <= h2d["fetch"] <= (k - born) * (row + 8)
    written = k if written is None else written
    assert d2h["writeback"] == written * (8 + row)             # key + row out
    assert h2d["writeback"] == 0                               # nothing looked up or erased by key
    if ranks == 1:
        assert h2d["mpi"] == d2h["mpi"] == 0
        assert sum(h2d.values()) - h2d["fetch"] <= 1.25 * m["batch_bytes"]


def assert_device_dedup(m, batches, n_parts=1):
    """Every one of ``batches`` had its keys deduplicated on the device (``hps/train/_device_batch.py``):
    its raw arrays went up once (``plan`` is their bytes, plus at most 7 bytes of alignment for each of
    its 6 arrays, plus its mini-batches' P + 1 bounds, 8 B each: no plan and no working set went up
    besides), the host uploaded nothing else but rows
    (``fetch``), within 1.25x the raw bytes, and only misses came down (``plan``: 8 B a key fetched;
    with ``n_parts`` parts also n_parts counts for every mini-batch's and every working set's partition),
    besides the mini-batches' offsets (:func:`plan_offsets`)."""
    h2d, d2h = m["h2d_bytes"], m["d2h_bytes"]
    assert m["device_dedup_batches"] == batches
    assert 0 <= h2d["plan"] - m["batch_bytes"] - 8 * (m["minibatches"] + batches) <= 7 * 6 * batches
    assert sum(h2d.values()) - h2d["fetch"] <= 1.25 * m["batch_bytes"]
    counts = 8 * n_parts * (m["minibatches"] + batches) if n_parts > 1 else 0
    assert d2h["plan"] == 8 * m["hbm_fetched_rows"] + counts + plan_offsets(m)


def plan_offsets(m):
    """d2h ``plan`` bytes of the mini-batches' offsets in their batch's distinct keys and gradient
    chunks (``hps.gpu.minibatch_plans``): 16 (P + 1) a batch deduplicated on the device, so 16 x
    (mini-batches + batches) when every batch was (one rank)."""
    return 16 * (m["minibatches"] + m["device_dedup_batches"]) if m["device_dedup_batches"] else 0


@pytest.mark.parametrize("case", sorted(CASES))
def test_device_cuda_trains_on_the_simulated_gpu_like_the_cpu(tmp_path, case):
    args, width = CASES[case]
    ec, mc = run(tmp_path, "cpu", args)
    eg, mg = run(tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert mg["examples"] == mc["examples"] == 300
    assert round(mg["auc"], 4) == round(mc["auc"], 4)
    assert np.allclose(mg["loss_per_batch"], mc["loss_per_batch"], rtol=1e-5)
    assert mg["minibatches"] == 6
    assert_ledger(mg, width, batches=3, fetched=mg["table_rows"])  # 3 batches: nothing evicted early
    assert_device_dedup(mg, batches=3)  # one rank, no feature reading keys on the host
    assert mc["h2d_bytes"] == mc["d2h_bytes"] == dict.fromkeys(mc["h2d_bytes"], 0)  # the CPU copies nothing


@pytest.mark.parametrize("parts,gpus", [(2, 1), (3, 2)])
def test_parts_on_several_simulated_gpus_train_like_the_cpu(tmp_path, parts, gpus, no_warm_up):
    """--n-parts over --gpus (Algorithm 2 on one node): each mini-batch's keys are partitioned on the
    device, every part's rows are found, read and updated on its own GPU, and only what the main GPU
    needs crosses between GPUs (``peer_bytes``; none with one GPU). The simulator has one GPU; ``--gpus
    2`` there makes every cross-GPU copy a real (NumPy) copy, counted like the GPU's would be. The
    HBM-PS starts at 8 keys and grows between batches."""
    args = ["--n-parts", str(parts), "--gpus", str(gpus), "--sparse-optimizer", "adam", "--hbm-capacity", "8"]
    ec, mc = run(tmp_path, "cpu", args[:2] + args[4:])
    eg, mg = run(tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert round(mg["auc"], 4) == round(mc["auc"], 4)
    assert np.allclose(mg["loss_per_batch"], mc["loss_per_batch"], rtol=1e-5)
    assert_ledger(mg, 3 + 7, batches=3, fetched=mg["table_rows"], n_parts=parts)  # ctr rows: 3 + Adam state 7
    assert_device_dedup(mg, batches=3, n_parts=parts)  # one rank: keys deduplicated and partitioned on the device
    assert (mg["peer_bytes"] > 0) == (gpus > 1)


def test_parts_send_mini_batch_keys_as_positions_within_the_byte_target(tmp_path, no_warm_up):
    """The worst case of the host's uploads besides rows: HBM-PS parts with keys deduplicated on the host
    (expiry reads every batch's keys there; nothing expires in 2 batches) and mini-batches that share few keys (8 fields of 1,000 values, 25 examples a mini-batch), so most
    keys are misses and the mini-batches' keys are about as many as the working set's. The working
    set goes up once (8 B a key) and is looked up, partitioned, on the device, its misses looked up
    again once inserted without another upload, and every mini-batch's keys go up as their positions in
    it (2 B here): ``plan`` stays within 1.25x the raw bytes (1.29x when the parts looked host keys up
    and the mini-batches' keys went up at 8 B), and the job still ends with the CPU's model."""
    args = ["--rows", "100", "--fields", "8", "--vocab-per-field", "1000", "--batch-size", "50",
            "--minibatch-size", "25", "--n-dense", "0", "--n-parts", "2", "--expire-after", "50"]
    ec, mc = run(tmp_path, "cpu", args)
    eg, mg = run(tmp_path, "cuda", args)
    assert_same_model(ec, eg)
    assert round(mg["auc"], 4) == round(mc["auc"], 4)
    assert np.allclose(mg["loss_per_batch"], mc["loss_per_batch"], rtol=1e-5)
    assert mg["device_dedup_batches"] == 0 and mg["minibatches"] == 4
    assert mg["h2d_bytes"]["plan"] <= 1.25 * mg["batch_bytes"]
    assert_ledger(mg, CASES["ctr-adagrad"][1], batches=2, fetched=mg["table_rows"], n_parts=2)


def test_a_job_repeats_bit_for_bit_whatever_the_launch_geometry(tmp_path, monkeypatch, no_warm_up):
    """Run-to-run determinism of ``--device cuda``: the same job under launch geometries that order a
    GPU's threads differently (block size, blocks, grid-stride rounds) ends with the same bits, because
    no float sum of the step depends on the order threads run in (the gradient sums are
    ``pool_backward_sorted_async``; float atomics made them differ in the last bits, which Adam's
    normalised steps amplify over a run). The deepfm/Adam job: its step runs every kernel the other
    models' do (pooling, the sorted backward, a row update) besides its own, Adam amplifies the
    smallest difference, and its HBM-PS grows from 8 keys meanwhile."""
    from hps import _launch

    args = CASES["deepfm-adam-growth"][0]
    exports = []
    for i, (block, blocks) in enumerate([(16, 3), (64, 1), (8, 5)]):
        monkeypatch.setattr(_launch, "BLOCK_SIZE", block)
        monkeypatch.setattr(_launch, "SIM_MAX_BLOCKS", blocks)
        (tmp_path / str(i)).mkdir()
        exports.append(run(tmp_path / str(i), "cuda", args)[0])
    k0, v0, d0, f0 = exports[0]
    for k, v, d, f in exports[1:]:
        np.testing.assert_array_equal(k, k0)
        np.testing.assert_array_equal(v, v0)
        for name in d0:
            np.testing.assert_array_equal(d[name], d0[name])
        if f0 is not None:
            np.testing.assert_array_equal(f, f0)


def mpirun(mpiexec, args, tmp_path, name):
    out, metrics = tmp_path / name, tmp_path / f"{name}.json"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(REPO))
    r = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "hps.train", *TINY, *args, "--export",
                        str(out), "--metrics-out", str(metrics)], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return load_export(out, first_order=True), json.loads(metrics.read_text())


@pytest.mark.mpi
@pytest.mark.parametrize("sync,parts", [("owner", 1), ("allreduce", 1), ("allreduce", 2)])
def test_two_ranks_on_the_simulated_gpu_end_like_the_cpu(tmp_path, mpiexec, sync, parts):
    """Two ranks, each on its simulated GPU (or two, with parts): MPI's buffers are staged through the
    host (mpi4py here is not CUDA-aware) and counted as ``mpi``; the mini-batch loop still moves
    nothing else. With parts, the all-reduced keys are partitioned on the device again."""
    args = ["--sparse-sync", sync] + (["--n-parts", str(parts), "--gpus", "2"] if parts > 1 else [])
    ec, mc = mpirun(mpiexec, [*args, "--device", "cpu"], tmp_path, "cpu")
    eg, mg = mpirun(mpiexec, [*args, "--device", "cuda"], tmp_path, "cuda")
    assert_same_model(ec, eg)
    assert round(mg["auc"], 4) == round(mc["auc"], 4)
    rows = mg["table_rows"]  # every key once, at its owner; with allreduce every rank holds every key
    if parts == 1:
        # every resident row comes down once at the end, replicas too (only owners keep theirs)
        assert_ledger(mg, CASES["ctr-adagrad"][1], batches=3, ranks=2,
                      fetched=rows * (2 if sync == "allreduce" else 1))
    else:  # the counts of the all-reduced keys' partition are staged as mpi; the rest as above
        assert mg["d2h_bytes"]["minibatch"] == 16 * 3 * 2 and mg["h2d_bytes"]["minibatch"] == 0
        assert mg["peer_bytes"] > 0
    assert mg["h2d_bytes"]["mpi"] > 0 and mg["d2h_bytes"]["mpi"] > 0
    assert mg["device_dedup_batches"] == 0  # keys are exchanged on the host


def test_the_cuda_warm_up_also_trains_a_full_size_batch_and_leaves_the_job_untouched(tmp_path, monkeypatch):
    """On a GPU the warm-up trains the first batch once more at the job's own sizes (CuPy compiles some
    kernels per size class: hps.train._warmup); the simulator skips it, so here it is forced on. The
    scratch job replays the whole first batch in the job's mini-batches, and the real job ends as without
    any warm-up."""
    from hps.train import _feed, _warmup

    replays = []
    real_replay = _feed.Feed.replay.__func__

    def replay(cls, batches, *a):  # (batches, examples of the first, mini-batch size) of each scratch feed
        replays.append((len(batches), len(batches[0]), a[-1]))
        return real_replay(cls, batches, *a)

    monkeypatch.setattr(_feed.Feed, "replay", classmethod(replay))
    monkeypatch.setattr(_warmup, "simulated", lambda: False)
    for d in ("warm", "cold"):
        (tmp_path / d).mkdir()
    warm, _ = run(tmp_path / "warm", "cuda")
    assert replays[-1] == (1, 100, 50)  # one batch of the job's 100 examples, mini-batches of 50
    monkeypatch.setattr(_warmup, "warm_up", lambda trainer, log: 0.0)
    cold, _ = run(tmp_path / "cold", "cuda")
    (kw, vw, dw, _), (kc, vc, dc, _) = warm, cold
    np.testing.assert_array_equal(kw, kc)
    np.testing.assert_array_equal(vw, vc)
    for name in dw:
        np.testing.assert_array_equal(dw[name], dc[name])


@pytest.mark.parametrize("given, expected", [(None, 0.001), (0.0003, 0.0003)])
def test_a_cuda_job_trains_with_its_gil_switch_interval_and_restores_it(given, expected):
    """--device cuda trains with the interpreter's switch interval at ``DeviceBackend.switch_interval``
    unless --gil-switch-interval says otherwise (``Trainer.fit``), and leaves the process's as it was."""
    import sys

    from hps.config import Config
    from hps.train import Trainer

    before, seen = sys.getswitchinterval(), []
    flat = dict(rows=200, fields=2, vocab_per_field=40, batch_size=100, minibatch_size=50, hidden=[4],
                embedding_dim=3, progress=False, device="cuda", hbm_capacity=128, gil_switch_interval=given)
    t = Trainer(Config.from_flat(flat))
    train = t._train_batch
    t._train_batch = lambda w: seen.append(sys.getswitchinterval()) or train(w)
    try:
        t.fit()
    finally:
        t.close()
    assert seen and all(abs(s - expected) < 1e-9 for s in seen)
    assert sys.getswitchinterval() == before
