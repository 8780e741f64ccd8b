"""``bench.bench_host``'s job: the device comparison's shape, its synthetic-only options left out when the
data is given (pre-hashed Parquet: the reader keeps up), every job accepted by ``hps.train``'s parser."""

from bench.bench_host import JOB, job_args
from hps.cli import parse_config


def test_given_data_drops_the_synthetic_options_and_keeps_the_rest(tmp_path):
    mine = job_args(["--rows", "1000"])
    assert mine[:len(JOB)] == JOB and mine[-2:] == ["--rows", "1000"]
    given = job_args(["--format", "parquet", "--data", str(tmp_path)])
    assert not {"--rows", "--fields", "--vocab-per-field"} & set(given)
    assert "1000000" not in given and given[given.index("--batch-size") + 1] == "65536"
    cfg = parse_config(given)
    assert cfg.data.format == "parquet" and cfg.train.batch_size == 65536 and cfg.model.embedding_dim == 32
