"""The --consistency het flags: parsed from the command line and TOML, bad values stop the job with
one line (exit 2), and a one-process job under HET (nothing to cache) is BSP."""

import json

import numpy as np
import pytest

from hps.config import STALENESS_UNBOUNDED, Config
from hps.train import load_export, main
from hps.cli import parse_config
from tests.test_train_input import SMALL, assert_fails_at_start, hps_train


def test_flags_and_toml_keys(tmp_path):
    c = parse_config(["--consistency", "het", "--staleness", "inf", "--het-cache", "0.1", "--het-policy", "lru"])
    t = c.train
    assert (t.consistency, t.staleness, t.het_cache, t.het_policy) == ("het", STALENESS_UNBOUNDED, 0.1, "lru")
    (tmp_path / "job.toml").write_text('[train]\nconsistency = "het"\nstaleness = 7\nhet-cache = "2MiB"\n')
    t = parse_config(["--config", str(tmp_path / "job.toml")]).train
    assert (t.consistency, t.staleness, t.het_cache, t.het_policy) == ("het", 7, 2 << 20, "lfu")
    assert Config().train.consistency == "bsp"


@pytest.mark.parametrize("args, needle", [
    (["--staleness", "-1"], "staleness must be an integer >= 0 or inf"),
    (["--staleness", "soon"], "staleness must be an integer >= 0 or inf"),
    (["--het-cache", "1.5"], "het-cache must be a fraction in [0, 1]"),
    (["--het-cache", "lots"], "cannot read 'lots' as a size"),
    (["--consistency", "het", "--sparse-sync", "allreduce"], "--consistency het caches rows of their owners"),
    (["--consistency", "het", "--compress", "bf16"], "--consistency het sends its rows and pushes uncompressed"),
])
def test_bad_values_stop_with_one_line(tmp_path, args, needle):
    assert_fails_at_start(hps_train(*SMALL, *args, cwd=tmp_path), needle)


def test_a_fraction_needs_a_known_table_size(tmp_path):
    (tmp_path / "d.libfm").write_text("".join(f"{i % 2} {i % 7}:1 {10 + i % 5}:1\n" for i in range(600)))
    assert_fails_at_start(hps_train("--format", "libsvm", "--data", "d.libfm", "--consistency", "het",
                                    "--het-cache", "0.1", "--no-progress", cwd=tmp_path),
                          "--het-cache 0.1 is a fraction of the embedding table")


def test_one_process_het_is_bsp(tmp_path):
    for mode in ("bsp", "het"):
        assert main([*SMALL, "--consistency", mode, "--staleness", "5", "--export", str(tmp_path / mode),
                     "--metrics-out", str(tmp_path / f"{mode}.json")]) == 0
    a, b = load_export(tmp_path / "bsp"), load_export(tmp_path / "het")
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    m = json.loads((tmp_path / "het.json").read_text())
    assert m["consistency"] == "het" and m["het_reads"] == 0 and m["het_hit_rate"] == 0.0
