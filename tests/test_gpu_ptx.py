"""Every CUDA kernel of the table compiles to PTX with the real Numba CUDA compiler (no GPU needed).

The simulator runs kernels as Python and accepts code the real compiler rejects (e.g. uint64 mixed
with signed literals silently becoming float64); this test is the CI gate for that. Kernels are
discovered automatically; argument types come from the parameter *names*, so a new kernel with a
new parameter name fails here until the name is added to ``_ARG_TYPES``.
"""

import inspect
import os

import numpy as np
import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("PTX compilation needs the real compiler, not the simulator", allow_module_level=True)

cuda = pytest.importorskip("numba.cuda")
try:
    from numba.cuda.dispatcher import CUDADispatcher
except ImportError:  # pragma: no cover - numba-cuda missing
    pytest.skip("numba-cuda is not importable", allow_module_level=True)
from numba import types  # noqa: E402

from hps.gpu import _table_kernels as K  # noqa: E402

_FLOATS = {np.dtype(np.float32): types.float32, np.dtype(np.float64): types.float64}


def _arg_types(ftype, rows_type=None):
    """Numba type of each kernel parameter name, for a table of float type ``ftype``."""
    rows_type = ftype if rows_type is None else rows_type
    return {
        "tkeys": types.uint64[::1],
        "tstate": types.int32[::1],
        "tvals": ftype[:, ::1],
        "owner": types.int32[::1],
        "keys": types.uint64[::1],
        "key": types.uint64,
        "hit": types.int64[::1],
        "mark": types.boolean,
        "accumulate": types.boolean,
        "counts": types.int64[::1],
        "rows": rows_type[:, ::1],
        "slots": types.int64[::1],
        "is_new": types.int8[::1],
        "out": ftype[:, ::1],
        "found": types.boolean[::1],
    }


def _kernels():
    """name -> dispatcher of every kernel (not device function) in the kernel module."""
    return {name: obj for name, obj in vars(K).items()
            if isinstance(obj, CUDADispatcher) and not obj.targetoptions.get("device", False)}


def _uses_atomics(func, seen=()):
    """True if ``func`` (a Python function) calls cuda.atomic.* itself or through a device function."""
    names = func.__code__.co_names
    if "atomic" in names:
        return True
    for n in names:
        obj = getattr(K, n, None)
        if isinstance(obj, CUDADispatcher) and n not in seen:
            if _uses_atomics(obj.py_func, seen + (n,)):
                return True
    return False


def _compile(func, argtys):
    params = list(inspect.signature(func).parameters)
    missing = [p for p in params if p not in argtys]
    assert not missing, f"{func.__name__}: add a type for parameter(s) {missing} to _arg_types"
    sig = types.void(*[argtys[p] for p in params])
    ptx, _ = cuda.compile_ptx(func, sig, cc=(9, 0))
    return ptx


class _Hopper:
    compute_capability = (9, 0)


@pytest.fixture(autouse=True)
def _device_functions_without_gpu(monkeypatch):
    """Numba compiles a kernel's device functions for the *current* device's compute capability;
    without a GPU there is none, so pretend to be cc 9.0 (the target of this test anyway)."""
    try:
        if cuda.is_available():
            return
    except Exception:
        pass
    import numba.cuda.dispatcher as dispatcher_mod

    assert hasattr(dispatcher_mod, "get_current_device"), \
        "numba-cuda moved get_current_device: update this fixture"
    monkeypatch.setattr(dispatcher_mod, "get_current_device", lambda: _Hopper())


def test_kernels_are_discovered():
    names = set(_kernels())
    assert {"upsert_claim", "upsert_rows", "claim", "rollback", "write_rows", "get", "contains",
            "erase", "clear"} <= names


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(_kernels()))
def test_kernel_compiles_to_ptx(name, dtype):
    func = _kernels()[name].py_func
    ftype = _FLOATS[np.dtype(dtype)]
    ptx = _compile(func, _arg_types(ftype))
    assert ".entry" in ptx
    if _uses_atomics(func):
        assert "atom" in ptx, f"{name} uses cuda.atomic but its PTX has no atom instruction"
    if dtype == np.float32:
        # a float32 table has no float64 anywhere: an f64 here means a uint64 expression was
        # promoted to float64 (uint64 mixed with a signed integer), i.e. a hashing/probing bug
        assert ".f64" not in ptx, f"{name}: float64 arithmetic in a float32 kernel"


@pytest.mark.parametrize("src", [np.int32, np.int64, np.uint64, np.bool_, np.float64])
def test_cast_rows_compiles_from_other_dtypes(src):
    """Device rows of another numeric dtype are converted by ``cast_rows`` (see rows_in)."""
    from numba.np.numpy_support import from_dtype

    ptx = _compile(K.cast_rows.py_func, _arg_types(types.float32, from_dtype(np.dtype(src))))
    assert ".entry" in ptx


def test_cuda_table_without_gpu_raises_device_unavailable():
    from hps import table
    from hps.errors import DeviceUnavailableError

    try:
        has_gpu = cuda.is_available()
    except Exception:
        has_gpu = False
    if has_gpu:
        pytest.skip("a GPU is present")
    with pytest.raises(DeviceUnavailableError, match="device='cuda'"):
        table.HashTable(capacity=10, dim=2, device="cuda")
