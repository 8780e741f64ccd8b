"""``--ssd-path``: a job claims its own rank directory, never deletes what it did not create, refuses a
path another job holds (naming that job), and removes its store at the end unless ``--keep-ssd``."""

import functools
import os
import subprocess
import sys

from hps.ssd import SSDStore
from hps.train import Trainer, load_export, main
from hps.train._cli import parse_config
from tests.budgets import spill_budget
from tests.test_train import SMALL, assert_same_model, run_cli

ROWS = ["--rows", "4096"]


@functools.cache
def budget() -> str:
    """A --mem-budget whose MEM-PS caches 1,500 rows, below the table (~4,800 rows): rows spill to the SSD-PS."""
    return str(spill_budget([*SMALL, *ROWS], 1500, 12_000))


def _tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def test_foreign_files_are_refused_and_kept(tmp_path, capsys):
    rank_dir = tmp_path / "ssd" / "rank0-of-1"
    rank_dir.mkdir(parents=True)
    (rank_dir / "notes.txt").write_text("mine")
    (rank_dir / "store").mkdir()  # the name hps gives its own store: still not hps's
    (rank_dir / "store" / "data.bin").write_bytes(b"1234")
    assert main([*SMALL, *ROWS, "--ssd-path", str(tmp_path / "ssd")]) == 2
    err = capsys.readouterr().err
    assert "holds files hps did not create (notes.txt, store)" in err and str(rank_dir) in err
    assert len(err.strip().splitlines()) == 1
    assert _tree(rank_dir) == ["notes.txt", "store", "store/data.bin"]
    assert (rank_dir / "notes.txt").read_text() == "mine"


def test_the_store_is_removed_at_the_end_with_the_directories_the_job_made(tmp_path):
    ssd = tmp_path / "made" / "ssd"  # neither exists: the job makes both and removes both
    assert main([*SMALL, *ROWS, "--ssd-path", str(ssd)]) == 0
    assert not (tmp_path / "made").exists()


def test_an_empty_rank_directory_is_used_and_left_as_found(tmp_path):
    rank_dir = tmp_path / "ssd" / "rank0-of-1"
    rank_dir.mkdir(parents=True)
    (tmp_path / "ssd" / "other.txt").write_text("the root may hold anything")
    assert main([*SMALL, *ROWS, "--ssd-path", str(tmp_path / "ssd")]) == 0
    assert _tree(tmp_path / "ssd") == ["other.txt", "rank0-of-1"]


def test_keep_ssd_keeps_the_store_and_the_next_job_refuses_to_delete_it(tmp_path, capsys):
    ssd = tmp_path / "ssd"
    assert main([*SMALL, *ROWS, "--ssd-path", str(ssd), "--keep-ssd", "--mem-budget", budget()]) == 0
    store = ssd / "rank0-of-1" / "store"
    assert f"SSD-PS kept in {store} (--keep-ssd)" in capsys.readouterr().out
    with SSDStore(store, dim=16) as s:  # 8 embedding + 8 Adagrad columns
        assert len(s) > 0  # the MEM-PS budget spilled rows to it
    before = _tree(ssd)
    assert main([*SMALL, *ROWS, "--ssd-path", str(ssd)]) == 2
    err = capsys.readouterr().err
    assert "holds the SSD-PS of an earlier job" in err and f"pid {os.getpid()}" in err
    assert "kept with --keep-ssd" in err
    assert _tree(ssd) == before


def test_a_second_job_on_the_same_path_is_refused_and_the_first_is_unharmed(tmp_path):
    """The first job (this process) holds the path; the second (a subprocess) must neither delete nor
    reuse its store, and must say which job holds it. The first then trains to the exact model."""
    ssd = tmp_path / "ssd"
    first = Trainer(parse_config([*SMALL, "--ssd-path", str(ssd), "--mem-budget", budget()]))
    try:
        second = subprocess.run([sys.executable, "-m", "hps.train", *SMALL, *ROWS, "--ssd-path", str(ssd)],
                                capture_output=True, text=True, timeout=300)
        assert second.returncode == 1, second.stderr
        assert f"is in use by another job (pid {os.getpid()} on " in second.stderr
        assert "Traceback" not in second.stderr
        first.fit()
        first.export(str(tmp_path / "first"))
    finally:
        first.close()
    assert not ssd.exists()
    ref, _ = run_cli(tmp_path, "ref", "--mem-budget", budget())
    assert_same_model(ref, load_export(tmp_path / "first"), 0.0)
