"""The one CUDA launch helper (``hps._launch``) and the numba-cuda import check (``hps._xp``), on the
host: no GPU needed."""

import sys
import warnings

import pytest

from hps import _launch, _xp
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
        _launch.cuda()


def test_a_missing_numba_cuda_says_install_the_gpu_extra(monkeypatch):
    monkeypatch.setattr(_xp, "_cuda", None)
    monkeypatch.setattr(_xp, "_cuda_error", ImportError("No module named 'numba.cuda'"))
    with pytest.raises(DeviceUnavailableError, match=r'pip install -e "\.\[gpu\]"'):
        _xp.array_module("cuda")
    assert _xp.array_module("cpu") is sys.modules["numpy"]


def test_the_gpu_extra_pins_a_numpy_numba_cuda_imports_under():
    from pathlib import Path

    setup = (Path(__file__).resolve().parents[1] / "setup.py").read_text()
    gpu_line = next(line for line in setup.splitlines() if line.strip().startswith('"gpu":'))
    assert '"numpy<2.5"' in gpu_line


class _Kernel:
    """A stand-in dispatcher: ``kernel[blocks, threads, stream]`` configures a real numba-cuda kernel
    (which raises numba-cuda's own small-grid warning, a class unrelated to Numba's: an H200 run printed
    it while the filter named only Numba's) and launches nothing."""

    def __init__(self):
        self.configured, self.calls = 0, []
        cuda = pytest.importorskip("numba.cuda")

        @cuda.jit
        def noop(a):
            pass

        self.real = noop

    def __getitem__(self, cfg):
        self.configured += 1
        self.real[cfg]  # warns: fewer than 128 blocks
        return lambda *args: self.calls.append((cfg, args))


def test_launch_caches_configurations_and_keeps_numba_small_grid_warnings_to_itself():
    k = _Kernel()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning reaching the caller fails
        _launch.launch(k, (3, 256), 0, "a")
        _launch.launch(k, (3, 256), 0, "b")
        _launch.launch(k, (4, 256), 0, "c")
    assert k.configured == 2 and [c[1] for c in k.calls] == [("a",), ("b",), ("c",)]
    assert k.calls[0][0] == (3, 256, 0)


def test_grids_fill_the_device_and_stop_at_the_work(monkeypatch):
    monkeypatch.setattr(_launch, "_max_blocks", lambda: 8 * 132)  # an H100: 132 SMs
    monkeypatch.setattr(_launch, "BLOCK_SIZE", 256)
    assert _launch.grid1(700) == (3, 256)            # a small batch: the blocks it needs
    assert _launch.grid1(10**8) == (8 * 132, 256)    # a large one: every SM busy, loops do the rest
    assert _launch.grid1(0) == (1, 256)
    assert _launch.grid_rows(10**8, 49) == (8 * 132, (32, 8))
    assert _launch.grid_rows(5, 3) == (1, (4, 64))


def test_blocks_fit_the_shared_arrays_of_the_kernels_that_size_them():
    """The table's ``get`` keeps one slot per thread of its block in a shared array of GET_MAX_BLOCK
    entries and is launched with ``grid1``'s BLOCK_SIZE threads: a larger block would write past it."""
    K = pytest.importorskip("hps.table._cuda_kernels")
    assert _launch.BLOCK_SIZE <= K.GET_MAX_BLOCK
