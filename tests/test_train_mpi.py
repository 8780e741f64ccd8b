"""Multi-process training under mpiexec: each rank reads its own shards, the job ends with exactly the
model of one process reading the same shards (``--data-shards N``), per-rank work falls with N, and
a bad or dying rank ends the job instead of hanging it."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hps.comm._wait import node_cores
from hps.data import CriteoReader
from hps.mem import owner_of
from hps.train import load_export, main
from tests.budgets import SPILL as BUDGET_PLACEHOLDER
from tests.budgets import resolve_spill

pytestmark = pytest.mark.mpi

SMALL = ["--rows", "12000", "--fields", "4", "--vocab-per-field", "3000", "--batch-size", "2048",
         "--minibatch-size", "256", "--hidden", "16,8", "--embedding-dim", "8", "--no-progress"]


def criteo_file(path, n=12000, seed=0, interleaved=False):
    """A Criteo TSV file with a planted signal in fields 0-3 and uneven lines: the first half has
    its counts and most categoricals missing (short lines), the second half is full (long lines): equal
    byte ranges would hold very different numbers of examples; the shards' ranges follow the lines
    (``hps.data._shards``), so the first shards hold the short lines. ``interleaved``: every other line
    short instead, so every shard holds both kinds."""
    rng = np.random.default_rng(seed)
    vals = np.minimum(rng.zipf(1.3, size=(n, 4)) - 1, 2999)
    weight = np.random.default_rng(seed + 1).standard_normal((4, 3000))
    p = 1 / (1 + np.exp(-(weight[np.arange(4), vals].sum(axis=1) - 0.5)))
    labels = (rng.random(n) < p).astype(int)
    rest = rng.integers(0, 40, size=(n, 22))
    ints = rng.integers(0, 10**6, size=(n, 13))
    lines = []
    for i in range(n):
        cats = [f"{v:08x}" for v in vals[i]]
        if (i % 2 == 0) if interleaved else (i < n // 2):
            cats += [""] * 22
            counts = [""] * 13
        else:
            cats += [f"{v:08x}" for v in rest[i]]
            counts = [str(x) for x in ints[i]]
        lines.append("\t".join([str(labels[i]), *counts, *cats]))
    path.write_text("\n".join(lines) + "\n")
    return path


def criteo_args(path, eval_data=True):
    return ["--format", "criteo", "--data", str(path), *(["--eval-data", str(path)] if eval_data else []),
            "--batch-size", "2048", "--minibatch-size", "256", "--hidden", "16,8", "--embedding-dim", "8",
            "--no-progress"]


def mpirun(mpiexec, n, args, timeout=300):
    return subprocess.run([mpiexec, "-n", str(n), sys.executable, "-m", "hps.train", *args],
                          capture_output=True, text=True, timeout=timeout)


def export_diff(a, b) -> float:
    """The largest |difference| between two exports (``load_export``'s tuples, with or without the
    first-order weights) over rows, first-order weights and dense parameters (NaN if any is NaN);
    asserts that they hold the same keys and the same parts."""
    (ka, va, da, fa), (kb, vb, db, fb) = (x if len(x) == 4 else (*x, None) for x in (a, b))
    oa, ob = np.argsort(ka), np.argsort(kb)
    np.testing.assert_array_equal(ka[oa], kb[ob])
    assert (fa is None) == (fb is None) and da.keys() == db.keys()
    diffs = [np.abs(va[oa] - vb[ob]).max()] + ([np.abs(fa[oa] - fb[ob]).max()] if fa is not None else [])
    return float(np.max(diffs + [np.abs(da[k] - db[k]).max() for k in da]))


def compare(a, b, tol):
    diff = export_diff(a, b)
    assert diff <= tol, diff


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return criteo_file(tmp_path_factory.mktemp("data") / "train.txt")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_file):
    """One process reading K shards: (export with first-order weights, metrics) by (data, K, model
    flags), run once each."""
    runs = {}

    def get(data, k, model=()):
        key = (data, k, tuple(model))
        if key not in runs:
            d = tmp_path_factory.mktemp(f"single-{data}-{k}")
            args = SMALL if data == "synthetic" else criteo_args(data_file)
            assert main([*args, *model, "--data-shards", str(k), "--export", str(d / "model"),
                         "--metrics-out", str(d / "m.json")]) == 0
            runs[key] = load_export(d / "model", first_order=True), json.loads((d / "m.json").read_text())
        return runs[key]

    return get


# a MEM-PS just above one batch's working set per rank, beside the SSD-PS index of the rank's table, and
# an HBM-PS cache of 1,024 rows (192 KiB; wdl rows are wider) below each rank's share of the table:
# rows leave every rank's HBM-PS for its MEM-PS, spill to the SSD-PS and come back
SPILL = ["--ranks-per-node", "2", "--mem-budget", BUDGET_PLACEHOLDER, "--rows-per-file", "128",
         "--hbm-budget", "192KiB"]


@pytest.mark.parametrize("data, n, k, model, extra", [
    ("synthetic", 2, 2, [], []),
    ("criteo", 2, 2, [], ["--mpi-wait", "spin"]),
    ("criteo", 4, 4, [], SPILL),
    ("criteo", 4, 4, ["--model", "wdl"], SPILL),  # first-order weights in the rows, over ranks and SSD
    ("synthetic", 2, 2, ["--model", "dlrm"], []),
    ("synthetic", 4, 4, [], ["--sparse-sync", "allreduce", "--ranks-per-node", "2"]),
    ("criteo", 2, 4, [], []),  # two shards per rank
])
def test_ranks_end_with_the_model_of_one_process_reading_the_same_shards(mpiexec, reference, data_file,
                                                                          tmp_path, data, n, k, model, extra):
    ref, mref = reference(data, k, model)
    args = SMALL if data == "synthetic" else criteo_args(data_file)
    argv = resolve_spill([*args, *model, *extra, *(["--data-shards", str(k)] if k != n else [])],
                         lambda a: mpirun(mpiexec, n, a), 1.3 * mref["table_rows"] / n)
    proc = mpirun(mpiexec, n, [*argv, "--export", str(tmp_path / "model"), "--metrics-out", str(tmp_path / "m.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    compare(ref, load_export(tmp_path / "model", first_order=True), 1e-5)
    m = json.loads((tmp_path / "m.json").read_text())
    assert round(m["auc"], 4) == round(mref["auc"], 4)
    assert m["ranks"] == n and m["data_shards"] == k and m["examples"] == mref["examples"]
    # --mpi-wait auto yields when the ranks outnumber the cores (this 2-core machine at 4 ranks)
    assert m["mpi_wait"] == ("spin" if "spin" in extra else "yield" if n > node_cores() else "spin")
    assert len(m["loss_per_batch"]) == len(mref["loss_per_batch"])
    # every row lives at its owner: rank r's export holds exactly the keys rank r owns
    for r in range(n):
        keys = load_export_shard(tmp_path / "model", r, n)
        assert keys.size and (owner_of(keys, n) == r).all()
    sent = m["bytes_sent"]
    if "--sparse-sync" in extra:  # Appendix C.3: everyone holds the global working set
        assert sent["sparse_allreduce"] > 0 and sent["sparse_rows"] == 0
        assert m["resident_rows"] == [mref["resident_rows"][0]] * n
    else:  # owners serve rows and take gradients with the same layout: as many bytes each way
        assert sent["sparse_rows"] == sent["sparse_grads"] > 0 and sent["sparse_allreduce"] == 0
        assert sent["sparse_keys"] > 0
        assert max(m["resident_rows"]) < 1.5 * mref["resident_rows"][0] / n
        assert sum(m["resident_rows"]) < 1.2 * mref["resident_rows"][0]
    if data == "criteo":  # every byte parsed once
        size = data_file.stat().st_size
        assert sum(m["bytes_parsed"]) == mref["bytes_parsed"][0] == size
    # each rank trained about its 1/n of the examples (the criteo file's shards follow its lines, whose
    # lengths differ along it: equal byte ranges gave rank 0 of 2 more than twice the examples of rank 1)
    assert sum(m["examples_per_rank"]) == m["examples"] and max(m["examples_per_rank"]) < 1.1 * m["examples"] / n
    if "--hbm-budget" in extra:  # every rank filled its HBM-PS budget and evicted to its MEM-PS
        assert m["resident_rows"] == [1024] * n and m["hbm_evicted_rows"] > 0
        assert m["hbm_fetched_rows"] > m["table_rows"]  # evicted rows came back


def load_export_shard(directory, r, n):
    import h5py

    with h5py.File(directory / f"sparse-rank{r}-of-{n}.h5", "r") as h:
        return h["keys"][()]


def test_resume_with_the_same_ranks_reproduces_an_uninterrupted_run(mpiexec, tmp_path):
    ck = str(tmp_path / "ck")
    full = mpirun(mpiexec, 2, [*SMALL, "--epochs", "2", "--export", str(tmp_path / "full")])
    assert full.returncode == 0, full.stderr[-2000:]
    first = mpirun(mpiexec, 2, [*SMALL, "--epochs", "1", "--checkpoint-dir", ck])
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = mpirun(mpiexec, 2, [*SMALL, "--epochs", "2", "--checkpoint-dir", ck, "--resume",
                                  "--export", str(tmp_path / "resumed")])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    compare(load_export(tmp_path / "full"), load_export(tmp_path / "resumed"), 0.0)
    wrong = subprocess.run([sys.executable, "-m", "hps.train", *SMALL, "--epochs", "2", "--checkpoint-dir", ck,
                            "--resume"], capture_output=True, text=True, timeout=300)
    assert wrong.returncode != 0 and "same number of ranks" in wrong.stderr


def test_a_shorter_shard_adds_empty_batches_instead_of_breaking_the_job(mpiexec, data_file, tmp_path):
    """Rank 1's shard holds far fewer examples (two files, a whole one per shard, the second a quarter of
    the first): it runs out first, the others carry on (no 'Message truncated'), and the job trains exactly
    the examples the two shards hold. (Different copies of the data per rank are refused:
    test_input_agreement_mpi.)"""
    short = tmp_path / "short.txt"
    short.write_bytes(b"".join(data_file.read_bytes().splitlines(keepends=True)[-3000:]))
    files = [data_file, short]
    shards = [sum(len(b) for b in CriteoReader(files, 1024, shard=(r, 2)).batches()) for r in range(2)]
    assert shards[1] < shards[0] - 2048  # rank 1 runs out at least one batch earlier
    args = criteo_args(data_file, eval_data=False)
    args[args.index("--data") + 1:args.index("--data") + 2] = [str(f) for f in files]
    proc = mpirun(mpiexec, 2, [*args, "--metrics-out", str(tmp_path / "m.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "truncated" not in proc.stderr
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["examples"] == sum(shards)


def _mpmd(mpiexec, groups, timeout=120):
    """``mpiexec -n a python -m hps.train ARGS : -n b …``; returns (process, seconds)."""
    cmd = [mpiexec]
    for count, args in groups:
        cmd += (["-n", str(count), sys.executable, "-m", "hps.train", *args] + [":"])
    t = time.time()
    proc = subprocess.run(cmd[:-1], capture_output=True, text=True, timeout=timeout)
    return proc, time.time() - t


@pytest.mark.parametrize("case", ["random bytes", "garbage after good data", "strict"])
def test_a_rank_reading_garbage_ends_the_job_naming_itself(mpiexec, tmp_path, case):
    """Rank 3 of 4 reads bad data — the last of the four files every rank is given, each rank reading
    one whole file: 1 MB of random bytes (found before training starts), or good lines followed by
    1 MB of garbage (found by its read stage in the middle of the run: too many malformed lines at
    the end of its pass; with --strict the first one, already in the chunk the warm-up parses).
    Either way the job ends within a minute, every rank non-zero, naming rank 3; no rank hangs in a
    collective. (A rank given another copy of the data stops at start: test_input_agreement_mpi.)"""
    good = [criteo_file(tmp_path / f"good{i}.txt", n=4000, seed=i) for i in range(3)]
    noise = np.random.default_rng(0).integers(0, 256, size=1 << 20, dtype=np.uint8).tobytes()
    bad = tmp_path / "bad.bin"
    if case == "random bytes":
        bad.write_bytes(noise)
    else:  # ~1.5 MB of good lines (more than the probe's first MiB), then noise
        bad.write_bytes(criteo_file(tmp_path / "long.txt", n=5000, seed=3).read_bytes() + noise)
    strict = ["--strict"] if case == "strict" else []
    args = criteo_args(good[0], eval_data=False)
    args[args.index("--data") + 1:args.index("--data") + 2] = [*map(str, good), str(bad)]
    t = time.time()
    proc = mpirun(mpiexec, 4, [*args, *strict], timeout=120)
    secs = time.time() - t
    assert proc.returncode != 0 and secs < 60, proc.stderr[-2000:]
    assert "hps: rank 3 of 4 failed" in proc.stderr and "truncated" not in proc.stderr
    assert "malformed" in proc.stderr or "no valid example" in proc.stderr
    if case == "garbage after good data":  # found while training, at the end of rank 3's pass
        assert "pipeline stage 'read' failed" in proc.stderr


def test_ranks_given_different_options_stop_with_one_clear_line(mpiexec):
    other = [a if a != "2048" else "4096" for a in SMALL]
    proc, secs = _mpmd(mpiexec, [(1, SMALL), (1, other)])
    assert proc.returncode != 0 and secs < 60
    assert "ranks were given different --batch-size: [2048, 4096]" in proc.stderr


def test_a_failing_rank_takes_the_job_down_with_its_name(mpiexec, tmp_path):
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    (ssd / "rank1-of-2").write_text("not a directory")  # rank 1 cannot create its SSD-PS
    t = time.time()
    proc = mpirun(mpiexec, 2, [*SMALL, "--ssd-path", str(ssd)], timeout=120)
    assert proc.returncode != 0
    assert time.time() - t < 60
    assert "rank 1 of 2 failed" in proc.stderr


def kill_rank_mid_run(mpiexec, tmp_path, *args):
    """Start a 2-rank job of ``SMALL`` + ``args`` on 5 M rows, SIGKILL rank 1 once it runs
    -> (finished process, seconds from the kill to the job's end)."""
    marker = str(tmp_path / "ssd-kill")
    proc = subprocess.Popen([mpiexec, "-n", "2", sys.executable, "-m", "hps.train", *SMALL,
                             "--rows", "5000000", *args, "--ssd-path", marker],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.time() + 60
    while victim is None and time.time() < deadline:
        time.sleep(0.2)
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if marker.encode() in cmd and b"PMI_RANK=1" in env and b"hps.train" in cmd:
                victim = int(pid)
    assert victim is not None, "rank 1 never started"
    time.sleep(1)
    t = time.time()
    os.kill(victim, 9)  # mid-run: 5 M rows take far longer than this
    proc.wait(timeout=90)
    return proc, time.time() - t


def test_a_killed_rank_takes_the_job_down(mpiexec, tmp_path):
    proc, took = kill_rank_mid_run(mpiexec, tmp_path)
    assert proc.returncode != 0
    assert took < 60


def test_a_job_frees_its_communicators_when_it_ends(mpiexec):
    """``hps.train.run`` called again and again in one process (a library user's loop): each job's
    communicators (its channels', EASGD's) are freed at its end, and the next job trains alike."""
    proc = subprocess.run([mpiexec, "-n", "2", sys.executable, str(Path(__file__).parent / "mpi" / "run_twice.py")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "run_twice: OK on 2 ranks" in proc.stdout
