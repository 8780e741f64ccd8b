"""The test harness itself: skipping by marker must not depend on where the checkout lives."""

import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_unmarked_tests_run_in_a_checkout_named_gpu(tmp_path):
    """A checkout in a directory named ``gpu`` (or ``cudasim``) once skipped every test: the conftest
    looked the markers up in ``item.keywords``, which also holds each parent directory's name."""
    root = tmp_path / "gpu" / "cudasim"
    (root / "tests").mkdir(parents=True)
    shutil.copy(HERE / "conftest.py", root / "tests" / "conftest.py")
    shutil.copy(HERE.parent / "pytest.ini", root / "pytest.ini")
    (root / "tests" / "test_plain.py").write_text(
        "import pytest\n\n"
        "def test_plain():\n    assert True\n\n"
        "@pytest.mark.cudasim\ndef test_sim_only():\n    assert True\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                       cwd=root, capture_output=True, text=True, env={"PATH": "", "NUMBA_ENABLE_CUDASIM": "0"})
    assert "1 passed, 1 skipped" in r.stdout, r.stdout + r.stderr
