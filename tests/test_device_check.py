"""``bench/device_check.sh`` packs its outputs into one archive only when its ``$OUT`` was empty at the start:
a folder that held anything before is left as it was (hps never deletes a file it did not create)."""

import subprocess
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(out: Path) -> None:
    subprocess.run(["bash", str(ROOT / "bench" / "device_check.sh")], env={"PATH": "/usr/bin:/bin", "OUT": str(out),
                   "STEPS": "none"}, capture_output=True, timeout=120, check=False)


def test_an_empty_out_ends_as_one_archive(tmp_path):
    _run(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["all.tgz"]
    with tarfile.open(tmp_path / "all.tgz") as t:
        assert "log.txt" in t.getnames()


def test_an_out_holding_files_is_left_as_it_was(tmp_path):
    (tmp_path / "mine").write_text("keep")
    _run(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt", "mine"]
    assert (tmp_path / "mine").read_text() == "keep"
