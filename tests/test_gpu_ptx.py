"""Every CUDA kernel (the table's and GPU training's) compiles to PTX with the real Numba CUDA
compiler (no GPU needed).

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

from hps.table import _cache_kernels_cuda as C  # noqa: E402
from hps.table import _cuda_kernels as K  # noqa: E402
from hps.gpu import _train_kernels as T  # noqa: E402
from hps.model import _optim_kernels_cuda as R  # noqa: E402
from hps.mem import _init_kernels_cuda as I  # noqa: E402
from hps.model import _dense_kernels_cuda as D  # noqa: E402
from hps.model import _layer_kernels_cuda as LK  # noqa: E402

MODULES = {"table": K, "train": T, "cache": C, "rows": R, "init": I, "dense": D, "layers": LK}

#: Kernels whose float32 version computes in float64 on purpose (as their CPU twins do).
F64_BY_DESIGN = {"rows.rowwise_adagrad_rows", "init.init_rows"}

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
        "out_keys": types.uint64[::1],
        # training kernels
        "missing": types.float64[::1],
        "inv": types.int64[::1],
        "field": types.int32[::1],
        "weights": ftype[::1],
        "offsets": types.int64[::1],
        "col0": types.int64,
        "width": types.int64,
        "grad_pooled": ftype[:, ::1],
        "grads": ftype[:, ::1],
        "lr": ftype,
        "lr64": types.float64,
        "b1": types.float64,
        "b2": types.float64,
        "l2": ftype,
        "idx": types.int64[::1],
        "salt": types.uint64,
        "n_parts": types.int64,
        "parts": types.int32[::1],
        "eps": ftype,
        "state_col": types.int64,
        "z": ftype[::1],
        "labels": ftype[::1],
        "denom": ftype,
        "dz": ftype[::1],
        "loss": types.float64[::1],
        "cells": types.float64[::1],
        "src": types.float64[::1],
        # the deterministic backward (BackwardPlan)
        "ex": types.int64[::1],
        "fld": types.int32[::1],
        "wts": ftype[::1],
        "cstart": types.int64[::1],
        "cend": types.int64[::1],
        "cptr": types.int64[::1],
        "partial": ftype[:, ::1],
        # the HBM-PS cache (scores, victims)
        "tscore": types.uint64[::1],
        "batch": types.uint64,
        "protect": types.uint64,
        "c_score": types.uint64[::1],
        "c_key": types.uint64[::1],
        "c_slot": types.int64[::1],
        "m": types.int64,
        "prefix": types.uint64[::1],
        "pas": types.int64,
        "hist": types.int64[::1],
        "rank": types.int64[::1],
        "out_slot": types.int64[::1],
        "out_score": types.uint64[::1],
        "out_key": types.uint64[::1],
        "scores": types.uint64[::1],
        # the row initializer
        "base": types.uint64,
        "emb_dim": types.int64,
        "scale": types.float64,
        "state_value": types.float32,
        # the dense optimizers
        "param": ftype[::1],
        "grad": ftype[::1],
        "moment1": ftype[::1],
        "moment2": ftype[::1],
        "accum": ftype[::1],
        "beta1": ftype,
        "cbeta1": ftype,
        "beta2": ftype,
        "cbeta2": ftype,
        "step_size": ftype,
        "bc2_sqrt": ftype,
        "epsilon": ftype,
        "rate": ftype,
        # the MLP's elementwise steps
        "y": ftype[:, ::1],
        "bias": ftype[::1],
        "relu": types.boolean,
        "zero": ftype,
        "act": ftype[:, ::1],
        "dy": ftype[:, ::1],
    }


def _kernels():
    """"module.name" -> dispatcher of every kernel (not device function) of the kernel modules."""
    return {f"{m}.{name}": obj for m, mod in MODULES.items() for name, obj in vars(mod).items()
            if isinstance(obj, CUDADispatcher) and not obj.targetoptions.get("device", False)}


def _uses_atomics(func, seen=()):
    """True if ``func`` (a Python function) calls cuda.atomic.* itself or through a device function."""
    names = func.__code__.co_names
    if "atomic" in names:
        return True
    for n in names:
        obj = func.__globals__.get(n)
        if isinstance(obj, CUDADispatcher) and n not in seen:
            if _uses_atomics(obj.py_func, seen + (n,)):
                return True
    return False


def _f64_params(func, argtys):
    return [p for p in inspect.signature(func).parameters if "float64" in str(argtys[p])]


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
    assert {f"table.{k}" for k in ("upsert_claim", "upsert_rows", "claim", "rollback", "write_rows", "get",
                                   "contains", "erase", "clear", "live_entries", "gather_keys")} <= names
    assert {f"cache.{k}" for k in ("lookup", "radix_hist", "radix_pick", "select_upto", "erase_slots",
                                   "set_scores")} <= names
    assert {f"rows.{k}" for k in ("sgd_rows", "adagrad_rows", "rowwise_adagrad_rows", "adam_rows")} <= names
    assert {f"train.{k}" for k in ("find_slots", "pool_forward", "pool_backward", "gather_rows", "part_of", "bce_loss_grad",
                                   "zero_rows", "zero_cells", "add_cells", "pool_backward_chunks",
                                   "sum_chunks")} <= names


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(_kernels()))
def test_kernel_compiles_to_ptx(name, dtype):
    func = _kernels()[name].py_func
    ftype = _FLOATS[np.dtype(dtype)]
    argtys = _arg_types(ftype)
    ptx = _compile(func, argtys)
    assert ".entry" in ptx
    if _uses_atomics(func):
        assert "atom" in ptx, f"{name} uses cuda.atomic but its PTX has no atom instruction"
    if dtype == np.float32 and not _f64_params(func, argtys) and name not in F64_BY_DESIGN:
        # a float32 table has no float64 anywhere: an f64 here means a uint64 expression was
        # promoted to float64 (uint64 mixed with a signed integer), i.e. a hashing/probing bug,
        # or a Python literal promoted float32 arithmetic
        assert ".f64" not in ptx, f"{name}: float64 arithmetic in a float32 kernel"


def test_float32_training_kernels_compute_rows_in_float32():
    """Kernels with a float64 accumulator (missing keys, loss) still compute rows and gradients in
    float32: the sigmoid's and dz's divisions stay div.rn.f32 (a promoted literal would make them
    f64; the one f64 division is log1p's, in the float64 loss)."""
    ptx = _compile(T.bce_loss_grad.py_func, _arg_types(types.float32))
    assert ptx.count("div.rn.f32") >= 2
    for kernel in (R.adagrad_rows, T.pool_forward, T.pool_backward, R.sgd_rows, T.gather_rows,
                   T.pool_backward_chunks, T.sum_chunks):
        assert ".f64" not in _compile(kernel.py_func, _arg_types(types.float32)), kernel.__name__


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


_PTX_WIDTH = {"8": 1, "16": 2, "32": 4, "64": 8}


def _ptx_params(ptx: str) -> list:
    """(width in bytes, "f" or "i") of every parameter of the PTX's kernel entry, in order."""
    import re

    entry = re.search(r"\.entry\s+\S+\((.*?)\)", ptx, re.S).group(1)
    params = re.findall(r"\.param\s+\.([a-z])(8|16|32|64)\s+\S+_param_(\d+)", entry)
    assert [int(i) for _, _, i in params] == list(range(len(params))), "unexpected PTX parameter list"
    return [(_PTX_WIDTH[w], "f" if k == "f" else "i") for k, w, _ in params]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("name", sorted(_kernels()))
def test_driver_launch_layout_matches_ptx(name, dtype):
    """``hps._driver_launch`` packs each kernel's parameters in the order, width and kind the compiled
    kernel declares (Numba's ABI: an array is meminfo, parent, size, itemsize, data, shape, strides)."""
    from hps._driver_launch import param_layout

    func = _kernels()[name].py_func
    argtys = _arg_types(_FLOATS[np.dtype(dtype)])
    layout = param_layout([argtys[p] for p in inspect.signature(func).parameters])
    assert layout is not None, f"{name}: an argument kind the driver launch cannot pack"
    assert [(w, k) for _, w, k in layout] == _ptx_params(_compile(func, argtys))


def test_driver_launch_layout_of_every_scalar_kind():
    """The probe kernel of ``hps._driver_launch`` (arrays of 1 and 2 dimensions, every scalar kind it
    packs) against its PTX."""
    from numba.cuda import types as t

    from hps._driver_launch import _probe_kernel, param_layout

    argtys = (t.float64[::1], t.uint64[::1], t.float32[:, :], t.int64[::1], t.int32, t.int64, t.uint64,
              t.float32, t.float64, t.boolean)
    layout = param_layout(argtys)
    ptx, _ = cuda.compile_ptx(_probe_kernel().py_func, types.void(*argtys), cc=(9, 0))
    assert [(w, k) for _, w, k in layout] == _ptx_params(ptx)
    assert [c for c, _, _ in layout][-6:] == ["q", "q", "Q", "f4x", "d", "?7x"]
