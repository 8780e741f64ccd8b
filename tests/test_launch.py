"""The numba-cuda import check (``hps._xp``), on the host: no GPU needed."""

import sys

import pytest

from hps import _xp
from hps.errors import DeviceUnavailableError


@pytest.fixture
def broken_numba_cuda(monkeypatch):
    """numba-cuda failing on import as 0.30.4 does under NumPy 2.5."""
    monkeypatch.setattr(_xp, "_cuda", None)
    monkeypatch.setattr(_xp, "_cuda_error", AttributeError("module 'numpy' has no attribute 'row_stack'"))


def test_numba_cuda_under_numpy_2_5_is_one_typed_line_saying_what_to_install(broken_numba_cuda):
    with pytest.raises(DeviceUnavailableError) as e:
        _xp.array_module("cuda")  # what --device cuda calls first
    msg = str(e.value)
    assert "\n" not in msg and "numpy<2.5" in msg and "--device cuda" in msg
    with pytest.raises(DeviceUnavailableError, match="numpy<2.5"):
        _xp.cuda_module()


def test_a_missing_numba_cuda_says_install_the_gpu_extra(monkeypatch):
    monkeypatch.setattr(_xp, "_cuda", None)
    monkeypatch.setattr(_xp, "_cuda_error", ImportError("No module named 'numba.cuda'"))
    with pytest.raises(DeviceUnavailableError, match=r"hps\[gpu\]"):
        _xp.array_module("cuda")
    assert _xp.array_module("cpu") is sys.modules["numpy"]


def test_the_gpu_extra_pins_a_numpy_numba_cuda_imports_under():
    from pathlib import Path

    setup = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    gpu_line = next(line for line in setup.splitlines() if line.strip().startswith('"gpu":'))
    assert '"numpy<2.5"' in gpu_line
