"""GPU buffers and MPI: CUDA-aware detection and host staging.

Device arrays are recognised by ``__cuda_array_interface__`` (CuPy, Numba, PyTorch...). Where MPI is
CUDA-aware, collectives take device buffers directly (the paper's GPU-RDMA path, Appendix C.2); otherwise
the device is synchronised, data is copied to pinned host memory, communicated, and copied back.
Nothing here imports CuPy or Numba CUDA unless a device array is actually passed.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from ._mpi import MPI

#: Environment override read by :func:`cuda_aware`: "1" forces the device path, "0" forces staging.
ENV_FORCE = "HPS_MPI_CUDA_AWARE"
_TRUE = ("1", "true", "yes", "on", "enabled")
_FALSE = ("0", "false", "no", "off", "disabled")


def _env_flag(name):
    """True / False for a recognised value of environment variable ``name``, else None."""
    v = os.environ.get(name, "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    return None


def _loaded_mpi_libraries():
    """Paths of the MPI shared libraries mapped into this process (Linux; [] elsewhere)."""
    paths = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1] if "/" in line else ""
                base = os.path.basename(path)
                if base.startswith("libmpi") and ".so" in base and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    return paths


def _mpix_query_cuda_support():
    """Result of ``MPIX_Query_cuda_support()`` from the loaded MPI library, or None if it has none."""
    for path in _loaded_mpi_libraries():
        try:
            lib = ctypes.CDLL(path, mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LOCAL | os.RTLD_LAZY)
            fn = lib.MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = []
        return bool(fn())
    return None


def local_cuda_support() -> bool:
    """This process's view of whether its MPI is CUDA-aware (no communication).

    In order: ``HPS_MPI_CUDA_AWARE`` (0/1) decides if set; ``MPICH_GPU_SUPPORT_ENABLED=0`` or
    ``OMPI_MCA_opal_cuda_support=false`` say no; then ``MPI.Query_cuda_support()`` (newer mpi4py) or
    ``MPIX_Query_cuda_support()`` (MPICH, Open MPI) answer when the library has them; without a query,
    ``MPICH_GPU_SUPPORT_ENABLED=1`` / ``OMPI_MCA_opal_cuda_support=true`` say yes; otherwise False.
    """
    forced = _env_flag(ENV_FORCE)
    if forced is not None:
        return forced
    env_mpich = _env_flag("MPICH_GPU_SUPPORT_ENABLED")
    env_ompi = _env_flag("OMPI_MCA_opal_cuda_support")
    if env_mpich is False or env_ompi is False:
        return False
    query = getattr(MPI, "Query_cuda_support", None)
    if callable(query):
        try:
            return bool(query())
        except Exception:  # noqa: BLE001 - an mpi4py without the binding underneath
            pass
    mpix = _mpix_query_cuda_support()
    if mpix is not None:
        return mpix
    return bool(env_mpich or env_ompi)


def cuda_aware(comm) -> bool:
    """Whether every rank of ``comm`` can pass device buffers to MPI. Collective (one allreduce)."""
    return bool(comm.allreduce(int(local_cuda_support()), op=MPI.MIN))


def is_device_array(a) -> bool:
    """True for objects exposing ``__cuda_array_interface__`` (but not host NumPy arrays)."""
    return hasattr(a, "__cuda_array_interface__") and not isinstance(a, np.ndarray)


def _is_cupy(a) -> bool:
    return type(a).__module__.split(".")[0] == "cupy"


def synchronize(a) -> None:
    """Wait until all work queued on the device that owns ``a`` is done (before any MPI call)."""
    if _is_cupy(a):
        import cupy

        cupy.cuda.Device().synchronize()
    else:
        from numba import cuda

        cuda.synchronize()


def _pinned_empty(shape, dtype, pinned):
    if pinned:
        try:
            from numba import cuda

            return cuda.pinned_array(shape, dtype=dtype)
        except Exception:  # noqa: BLE001 - no CUDA driver: fall back to pageable memory
            pass
    return np.empty(shape, dtype=dtype)


def to_host(a, pinned: bool = True) -> np.ndarray:
    """Host copy of ``a``: device arrays are synchronised and copied (into pinned memory if possible);
    host arrays are returned as ``np.asarray(a)`` (no copy). Blocking."""
    if not is_device_array(a):
        return np.asarray(a)
    synchronize(a)
    if _is_cupy(a):
        import cupy

        src = cupy.ascontiguousarray(a)
        out = _pinned_empty(src.shape, src.dtype, pinned)
        src.get(out=out)
        return out
    from numba import cuda

    src = cuda.as_cuda_array(a)
    out = _pinned_empty(src.shape, src.dtype, pinned)
    src.copy_to_host(out)
    return out


def to_device_like(host: np.ndarray, like):
    """New device array with the contents of ``host``, of the same kind (CuPy / Numba) as ``like``."""
    if _is_cupy(like):
        import cupy

        return cupy.asarray(host)
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(host))


def copy_to_device(host: np.ndarray, out) -> None:
    """Copy ``host`` into the existing device array ``out`` (same shape and dtype). Blocking."""
    if _is_cupy(out):
        out.set(np.ascontiguousarray(host))
        out.device.synchronize()
        return
    from numba import cuda

    cuda.as_cuda_array(out).copy_to_device(np.ascontiguousarray(host))
    cuda.synchronize()
