"""open_dataset: dispatch, unknown formats and options, missing files."""

import numpy as np
import pytest

from hps.data import (FORMATS, CriteoReader, CsvReader, DataFileNotFoundError, LibsvmReader,
                      SyntheticData, open_dataset)
from hps.errors import InvalidInputError


def test_dispatch(tmp_path):
    lib = tmp_path / "a.libsvm"
    lib.write_text("1 1:1 2:1\n0 3:1 4:1\n")
    csv = tmp_path / "a.csv"
    csv.write_text("click,a\n1,x\n")
    crit = tmp_path / "a.txt"
    crit.write_text("\t".join(["1"] + [""] * 39) + "\n")
    d = open_dataset(lib, "libsvm", 8, n_fields=3)
    assert isinstance(d, LibsvmReader) and d.n_fields == 3
    assert isinstance(open_dataset(csv, "csv", 8), CsvReader)
    c = open_dataset(crit, "criteo", 8, shard=(0, 2), int_as_categorical=True)
    assert isinstance(c, CriteoReader) and c.n_fields == 39
    assert [len(b) for b in c.batches()] == [1]  # the one line starts in shard 0's byte range
    assert list(open_dataset(crit, "criteo", 8, shard=(1, 2)).batches()) == []
    s = open_dataset(None, "synthetic", 100, rows=250, fields=2, seed=1)
    assert isinstance(s, SyntheticData) and [len(b) for b in s.batches()] == [100, 100, 50]
    for ds in (d, s):
        assert hasattr(ds, "stats") and ds.n_dense >= 0
    np.testing.assert_array_equal(next(s.batches(start_batch=2)).labels,
                                  list(s.batches())[2].labels)


def test_errors(tmp_path):
    with pytest.raises(InvalidInputError, match="unknown data format 'orc'.*criteo, csv, libsvm, parquet"):
        open_dataset(tmp_path, "orc", 8)
    with pytest.raises(DataFileNotFoundError):
        open_dataset(tmp_path / "missing.txt", "criteo", 8)
    with pytest.raises(InvalidInputError, match="needs a data path"):
        open_dataset(None, "libsvm", 8)
    with pytest.raises(InvalidInputError, match="unexpected keyword"):
        open_dataset(None, "synthetic", 8, colour="red")
    assert set(FORMATS) == {"criteo", "libsvm", "csv", "parquet", "synthetic"}
