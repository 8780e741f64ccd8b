"""The array-module seam: which module (NumPy or CuPy) holds a device's arrays.

One function, :func:`array_module`, answers it for the whole code base. On ``"cuda"`` it is CuPy on a
real GPU and **NumPy under Numba's CUDA simulator** (``NUMBA_ENABLE_CUDASIM=1``): there NumPy arrays
stand in for device arrays, the simulator runs the Numba CUDA kernels on them, and the same
``--device cuda`` code path runs in CI on a machine without a GPU. Code that must tell a simulated
GPU from a real one asks :func:`simulated`.
"""

from __future__ import annotations

import numpy as np

from ._extras import install_hint
from .errors import DeviceUnavailableError, InvalidInputError

__all__ = ["array_module", "simulated"]

#: The devices an array module exists for.
DEVICES = ("cpu", "cuda")


def simulated() -> bool:
    """True when Numba's CUDA simulator replaces the GPU (``NUMBA_ENABLE_CUDASIM=1`` at Numba import;
    read from ``numba.config``, the same switch ``numba.cuda`` obeys)."""
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def array_module(device: str):
    """The array module of ``device``: ``numpy`` for ``"cpu"``; for ``"cuda"``, ``numpy`` under the CUDA
    simulator, else ``cupy`` after checking that a GPU is really usable.

    Raises :class:`DeviceUnavailableError` (one line saying what to do) when ``"cuda"`` is asked for
    and CuPy is missing or sees no usable GPU; :class:`InvalidInputError` for an unknown device.
    """
    if device not in DEVICES:
        raise InvalidInputError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cpu" or simulated():
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
