"""The FAE profiler (seeds/003 §4.1-4.2): Student-t quantiles, the chunk-sampling interval's coverage
against exact counts on Zipf data, the threshold search, the profile file and the CLI."""

import numpy as np
import pytest

from hps.errors import InvalidInputError
from hps.mem import unique_counts
from hps.profile import (ChunkSample, examples_all_hot, hot_mask, profile, read_profile, search_threshold,
                         t_quantile, write_profile)
from hps.profile._main import main


@pytest.mark.parametrize("confidence, df, expected", [(0.95, 1, 12.7062047), (0.95, 10, 2.2281389),
                                                      (0.999, 34, 3.6007), (0.99, 5, 4.0321430),
                                                      (0.999, 2, 31.5990546)])
def test_t_quantiles_match_the_tables(confidence, df, expected):
    assert t_quantile(confidence, df) == pytest.approx(expected, rel=2e-4)


def zipf_counts(alpha, n_accesses, vocab, seed):
    """Access counts of the distinct keys of ``n_accesses`` Zipf(alpha) draws over ``vocab`` values."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** alpha
    draws = rng.choice(vocab, size=n_accesses, p=p / p.sum()).astype(np.uint64)
    return unique_counts(draws)[1]


#: Trials per case; at 99.9 % the expected misses are 0.1 % of them. Slack: at most MAX_MISSES misses
#: of TRIALS = 500 (for a true coverage of 99.9 %, P(more than 3 misses) = 0.0017).
TRIALS, MAX_MISSES = 500, 3


@pytest.mark.parametrize("alpha, hot_share", [(0.9, 0.05), (1.1, 0.05), (1.1, 0.01)])
def test_the_interval_covers_the_exact_hot_size_as_often_as_it_claims(alpha, hot_share):
    """Over 5 data seeds x 100 chunk-sampling seeds, the exact number of logger entries at the cutoff
    lies inside the 99.9 % interval (Eq. 4) in all but MAX_MISSES of TRIALS draws."""
    misses, widths = 0, []
    for data_seed in range(5):
        counts = zipf_counts(alpha, 400_000, 200_000, data_seed)
        cutoff = int(np.quantile(counts, 1 - hot_share)) + 1
        actual = int((counts >= cutoff).sum())
        for s in range(TRIALS // 5):
            e = ChunkSample(counts, 0.999, seed=1000 * data_seed + s).at(cutoff)
            misses += not (e.low <= actual <= e.high)
            widths.append((e.high - e.low) / max(actual, 1))
    assert misses <= MAX_MISSES, f"{misses} of {TRIALS} intervals missed the exact size"
    assert np.median(widths) < 1.0  # and the interval says something (narrower than the size itself)


def test_the_estimate_is_the_exact_count_when_the_logger_is_small():
    counts = np.array([5, 1, 1, 3, 9, 2], np.int64)
    e = ChunkSample(counts, 0.999, seed=0).at(3)
    assert e.estimate == e.low == e.high == 3


def test_the_threshold_search_fits_the_budget_with_the_smallest_cutoff():
    counts = zipf_counts(1.1, 300_000, 100_000, 7)
    sample = ChunkSample(counts, 0.999, seed=3)
    best = search_threshold(sample, 2_000, int(counts.max()))
    assert best.high <= 2_000
    assert best.cutoff == 1 or sample.at(best.cutoff - 1).high > 2_000
    assert search_threshold(sample, 0, int(counts.max())).cutoff == counts.max() + 1  # nothing is hot


def test_an_input_is_hot_only_if_all_its_keys_are():
    hot = np.array([3, 7, 11], np.uint64)
    keys = np.array([3, 7, 3, 8, 11, 99], np.uint64)
    offsets = np.array([0, 2, 4, 5, 6, 6], np.int64)      # [3 7] [3 8] [11] [99] []
    np.testing.assert_array_equal(examples_all_hot(hot_mask(hot, keys), offsets), [True, False, True, False, True])


def test_profile_file_round_trips_and_the_actual_size_is_inside(tmp_path):
    opts = {"rows": 30_000, "fields": 6, "vocab_per_field": 5000, "zipf": 1.1, "n_dense": 2, "seed": 1,
            "block_rows": 2048}
    prof = profile(None, "synthetic", hot_bytes=40_000, row_bytes=100, sample_rate=100, exact=True, fmt_options=opts)
    assert 0 < prof.hot_keys.shape[0] <= prof.budget_rows == 400
    assert prof.inside and prof.actual == prof.logged_hot
    assert np.all(np.diff(prof.hot_keys.astype(np.float64)) > 0)
    assert prof.hot_counts.min() >= prof.threshold_count
    write_profile(tmp_path / "p.h5", prof)
    back = read_profile(tmp_path / "p.h5")
    np.testing.assert_array_equal(back.hot_keys, prof.hot_keys)
    assert (back.threshold_count, back.actual, back.interval_high) == (prof.threshold_count, prof.actual,
                                                                       prof.interval_high)
    sampled = profile(None, "synthetic", hot_bytes=40_000, row_bytes=100, sample_rate=10, fmt_options=opts)
    assert sampled.actual is None and 0.05 < sampled.sampled_examples / 30_000 < 0.15  # ~10 % read
    empty = profile(None, "synthetic", hot_bytes=0, row_bytes=100, sample_rate=10, fmt_options=opts)
    assert empty.hot_keys.shape[0] == 0 and empty.hot_input_fraction == 0


def test_cli_writes_the_profile_and_reports_the_interval(tmp_path, capsys):
    out = tmp_path / "p.h5"
    assert main(["--rows", "20000", "--fields", "4", "--vocab-per-field", "3000", "--hot-bytes", "32KiB",
                 "--sample-rate", "100", "--exact", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "99.9 % interval [" in text and "inside the interval" in text
    assert read_profile(out).hot_bytes == 32 << 10
    assert main(["--hot-bytes", "1k", "--sample-rate", "0", "--out", str(out)]) == 2
    assert "sample-rate" in capsys.readouterr().err
    with pytest.raises(InvalidInputError, match="not an FAE profile"):
        (tmp_path / "x.h5").write_bytes(b"")
        import h5py
        h5py.File(tmp_path / "x.h5", "w").close()
        read_profile(tmp_path / "x.h5")


def test_an_out_that_cannot_be_written_stops_before_the_profiling_and_a_failed_write_keeps_the_old(
        tmp_path, capsys, monkeypatch):
    """--out in a missing directory or naming a directory: one line, exit 2, before any work (it was
    h5py's traceback after the profiling); the file is written beside and renamed, so a write that fails
    leaves an existing profile as it was."""
    job = ["--rows", "2000", "--fields", "2", "--vocab-per-field", "300", "--hot-bytes", "4KiB"]
    for out, why in ((tmp_path / "missing" / "p.h5", "does not exist"), (tmp_path, "is a directory")):
        assert main([*job, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert why in err and err.count("\n") == 1
    out = tmp_path / "p.h5"
    out.write_bytes(b"an earlier profile")
    import hps.profile._profile as P

    def broken(path, prof):
        open(path, "wb").write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(P, "_write_profile", broken)
    with pytest.raises(OSError):
        P.write_profile(out, None)
    assert out.read_bytes() == b"an earlier profile" and sorted(p.name for p in tmp_path.iterdir()) == ["p.h5"]


def test_csv_columns_are_read_as_the_training_run_reads_them(tmp_path):
    """--ignore-columns / --dense-columns as hps.train's: the profile's hot keys are keys of the model
    (without them every column was hashed as a field: no hot key was one the run trained)."""
    from hps.train import load_export
    from hps.train import main as train_main

    rng = np.random.default_rng(0)
    rows = [f"{i},{rng.integers(0, 2)},s{rng.zipf(1.5) % 50},{rng.random():.3f}" for i in range(3000)]
    (tmp_path / "d.csv").write_text("id,click,site,x\n" + "\n".join(rows) + "\n")
    cols = ["--ignore-columns", "id", "--dense-columns", "x"]
    assert main(["--data", str(tmp_path / "d.csv"), *cols, "--hot-bytes", "4KiB", "--sample-rate", "100",
                 "--out", str(tmp_path / "p.h5")]) == 0
    assert train_main(["--data", str(tmp_path / "d.csv"), *cols, "--batch-size", "1000", "--minibatch-size", "250",
                       "--no-progress", "--export", str(tmp_path / "m")]) == 0
    hot = read_profile(tmp_path / "p.h5").hot_keys
    assert hot.shape[0] > 0 and np.isin(hot, load_export(tmp_path / "m")[0]).all()
    # the profile records how it read the data; --fae refuses one read otherwise than its run reads
    assert main(["--data", str(tmp_path / "d.csv"), "--hot-bytes", "4KiB", "--sample-rate", "100",
                 "--out", str(tmp_path / "q.h5")]) == 0
    job = ["--data", str(tmp_path / "d.csv"), *cols, "--batch-size", "1000", "--minibatch-size", "250", "--no-progress"]
    assert train_main([*job, "--fae", str(tmp_path / "q.h5")]) == 2
    assert train_main([*job, "--fae", str(tmp_path / "p.h5")]) == 0
    import h5py

    with h5py.File(tmp_path / "q.h5", "a") as f:   # a profile of an older hps: nothing recorded, nothing checked
        del f.attrs["reader"]
    assert read_profile(tmp_path / "q.h5").reader == ""
    assert train_main([*job, "--fae", str(tmp_path / "q.h5")]) == 0
