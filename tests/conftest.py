import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


def _gpu_available() -> bool:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return False
    try:
        from numba import cuda

        return bool(cuda.is_available())
    except Exception:
        return False


def mpiexec_path():
    """mpiexec next to this interpreter (the pip mpich wheel puts it there), else on PATH."""
    cand = Path(sys.executable).parent / "mpiexec"
    return str(cand) if cand.exists() else shutil.which("mpiexec")


def pytest_collection_modifyitems(config, items):
    has_gpu = _gpu_available()
    sim = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
    for item in items:
        # markers, not ``item.keywords``: keywords also hold every parent directory's name, so a
        # checkout in a directory named ``gpu`` would skip every test
        if item.get_closest_marker("gpu") is not None and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if item.get_closest_marker("cudasim") is not None and not sim:
            item.add_marker(pytest.mark.skip(reason="runs under NUMBA_ENABLE_CUDASIM=1 (tests/cudasim)"))


@pytest.fixture(scope="session")
def shared_data():
    """Path of ../shared/data; skips the test when the (non-redistributable) data is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("shared/data is absent (real CTR data is never committed)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def mpiexec():
    exe = mpiexec_path()
    if exe is None:
        pytest.skip("mpiexec not found (pip install mpich)")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py not installed")
    return exe
