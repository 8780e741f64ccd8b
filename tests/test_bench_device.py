"""``python -m bench.bench_device``'s rounds (``--repeat``, ``--variant``): every job of a round runs in turn,
ratios are taken within a round, and the summary is each figure's median and range. The jobs are stood
in for (a real round needs a GPU, or minutes of the CUDA simulator)."""

import itertools
import os

import pytest

from bench import bench_device as B

TINY = ["--simulate", "--rows", "300", "--fields", "2", "--vocab-per-field", "40", "--batch-size", "100",
        "--minibatch-size", "50", "--hidden", "4", "--embedding-dim", "3", "--no-cpu"]


@pytest.fixture
def jobs(monkeypatch):
    order, rates = [], itertools.count(100, 10)

    def hps_job(job, device, env=None, name=None):
        order.append((name or device, dict(env or {})))
        return {"examples_per_sec": float(next(rates)), "table_rows": 7}

    def peer(*a, **k):
        order.append(("torch", {}))
        return {"examples_per_sec": 1000.0, "device": "cpu", "torch": "x"}

    monkeypatch.setattr(B, "_hps_job", hps_job)
    monkeypatch.setattr(B, "train_peer", peer)
    return order


def test_rounds_run_every_job_in_turn_and_report_medians_and_ranges(jobs, capsys, monkeypatch):
    monkeypatch.delenv("NUMBA_ENABLE_CUDASIM", raising=False)
    assert B.main([*TINY, "--repeat", "3", "--variant", "k:HPS_DENSE_STEP=kernel,HPS_X=1"]) == 0
    assert [n for n, _ in jobs] == ["cuda", "k", "torch"] * 3
    sim = {"NUMBA_ENABLE_CUDASIM": "1"}   # --simulate: the jobs' environment, never this process's (it would
    assert jobs[0][1] == sim               # put every CUDA kernel imported after it in the simulator)
    assert jobs[1][1] == {**sim, "HPS_DENSE_STEP": "kernel", "HPS_X": "1"}
    assert "NUMBA_ENABLE_CUDASIM" not in os.environ
    out = capsys.readouterr().out
    # cuda ran at 100, 120, 140 and k at 110, 130, 150: k / cuda in its round 1.1, 1.083, 1.071
    assert "cuda 120 (100-140); k 130 (110-150); torch 1,000 (1,000-1,000)" in out
    assert "k / cuda in the same round: median 1.083 (1.071-1.100)" in out
    assert "hps cuda / torch in the same round: median 0.120 (0.100-0.140)" in out


def test_one_round_is_the_old_single_run(jobs):
    assert B.main([*TINY, "--no-peer"]) == 0
    assert jobs == [("cuda", {"NUMBA_ENABLE_CUDASIM": "1"})]


@pytest.mark.parametrize("bad", [["--variant", "k"], ["--variant", "k:A=1,B"], ["--variant", ":A=1"],
                                 ["--variant", "cuda:A=1"], ["--repeat", "0"]])
def test_malformed_rounds_are_refused_before_any_job(jobs, bad):
    with pytest.raises(SystemExit):
        B.main([*TINY, *bad])
    assert jobs == []


def test_the_median_run_is_the_lower_middle_one():
    runs = [{"examples_per_sec": v} for v in (3.0, 1.0, 4.0, 2.0)]
    assert B._median_run(runs) == {"examples_per_sec": 2.0}
    assert B._spread([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "all": [3.0, 1.0, 2.0]}
