"""The array-module seam: which module (NumPy or CuPy) holds a device's arrays.

One function, :func:`array_module`, answers it for the whole code base. On ``"cuda"`` it is CuPy on a
real GPU and **NumPy under Numba's CUDA simulator** (``NUMBA_ENABLE_CUDASIM=1``): there NumPy arrays
stand in for device arrays, the simulator runs the Numba CUDA kernels on them, and the same
``--device cuda`` code path runs in CI on a machine without a GPU. Code that must tell a simulated
GPU from a real one asks :func:`simulated`. :func:`cuda_module` imports numba-cuda once for every
CUDA component and turns a failure into one line saying what to install.
"""

from __future__ import annotations

import numpy as np

from ._extras import install_hint
from .errors import DeviceUnavailableError, InvalidInputError

__all__ = ["array_module", "simulated", "cuda_module"]

#: The devices an array module exists for.
DEVICES = ("cpu", "cuda")


_cuda = None
_cuda_error: Exception | None = None


def _diagnose(e: Exception) -> str:
    """Why numba-cuda failed to import and what to install, in one line."""
    if isinstance(e, AttributeError) and "row_stack" in str(e):
        return (f"numba-cuda does not import under NumPy {np.__version__} (NumPy 2.5 removed np.row_stack, "
                "which numba-cuda 0.30 still names): pip install 'numpy<2.5' (what the gpu extra pins)")
    return f"numba-cuda failed to import ({type(e).__name__}: {e}): {install_hint('gpu')}"


def cuda_import_error() -> Exception | None:
    """The exception ``from numba import cuda`` raised, or None when it imports (tried once)."""
    global _cuda, _cuda_error
    if _cuda is None and _cuda_error is None:
        try:
            from numba import cuda
        except Exception as e:  # ImportError, or numba-cuda breaking on a newer NumPy
            _cuda_error = e
        else:
            _cuda = cuda
    return _cuda_error


def cuda_module(what: str = "device='cuda'"):
    """The ``numba.cuda`` module; raises :class:`DeviceUnavailableError` (one line: what needs it, why
    it failed, what to install) when it does not import."""
    err = cuda_import_error()
    if err is not None:
        raise DeviceUnavailableError(f"{what}: {_diagnose(err)}; or use the CPU") from err
    return _cuda


def simulated() -> bool:
    """True when Numba's CUDA simulator replaces the GPU (``NUMBA_ENABLE_CUDASIM=1`` at Numba import;
    read from ``numba.config``, the same switch ``numba.cuda`` obeys)."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def array_module(device: str):
    """The array module of ``device``: ``numpy`` for ``"cpu"``; for ``"cuda"``, ``numpy`` under the CUDA
    simulator, else ``cupy`` after checking that a GPU is really usable.

    Raises :class:`DeviceUnavailableError` (one line saying what to do) when ``"cuda"`` is asked for
    and numba-cuda does not import (:func:`cuda_module`), or CuPy is missing or sees no usable GPU;
    :class:`InvalidInputError` for an unknown device.
    """
    if device not in DEVICES:
        raise InvalidInputError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cpu":
        return np
    cuda_module("--device cuda")  # the kernels need numba-cuda: say what to install now, not mid-run
    if simulated():
        return np
    try:
        import cupy

        n_gpus = cupy.cuda.runtime.getDeviceCount()
    except ImportError as e:
        raise DeviceUnavailableError(f"--device cuda needs CuPy: {install_hint('gpu')}") from e
    except Exception as e:  # CUDARuntimeError (no driver, no device) and the like
        raise DeviceUnavailableError(f"--device cuda: no usable CUDA GPU ({e}); use --device cpu") from None
    if n_gpus < 1:
        raise DeviceUnavailableError("--device cuda: no usable CUDA GPU (no CUDA device); use --device cpu")
    return cupy
