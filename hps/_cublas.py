"""The dense network's matrix products on a GPU through cuBLAS called with ctypes, the GIL held
(``HPS_CUDA_GEMM=cublas-gil``), instead of through CuPy's ``matmul``.

Why: on an H200 the train stage spent ~2.2 ms of each ~4.5-ms mini-batch inside CuPy's products
(``_try_fastcall_matmul``, self time, 9 products a mini-batch: ~240 us each, where the GPU's share of
the job's 6.6 TFLOP is ~0.1 s; ``bench/results/gpu-h200-2026-11-28``). CuPy's cuBLAS calls hand the GIL
back, and a call that does so while the pipeline's prepare and place threads run Python gets it back a
GIL switch interval later (``python -m bench.gil_convoy``; ``hps._driver_launch`` holds it for hps's own
kernel launches for the same reason). A cuBLAS ``gemm`` only enqueues work: holding the GIL through
it costs the other threads microseconds.

Modes (:func:`mode`, ``HPS_CUDA_GEMM``): ``cupy`` (the default until a GPU has measured the others:
CuPy's ``matmul``), ``cublas-gil`` (``ctypes.PyDLL``: the GIL held through the call) and ``cublas``
(``ctypes.CDLL``: released, as CuPy does; isolates what holding it is worth). One cuBLAS handle per
device for the process (a work space of its own, so products can be captured into CUDA graphs; cuBLAS's
default math mode and pointer mode host: what CuPy's ``matmul`` uses without ``CUPY_TF32``), set to the
caller's current CuPy stream before a call; a lock makes setting the stream and the call one step, so
threads may share it. The library is the one CuPy
loaded (found in ``/proc/self/maps``), else ``libcublas.so.12``.

A row-major product ``C = A @ B`` is cuBLAS's column-major ``C^T = B^T A^T``: :func:`gemm_plan` maps
the three arrays' shapes and strides to ``gemm``'s arguments, for operands whose rows or columns are
contiguous (``x.T`` of a C-contiguous ``x`` is a transpose flag, not a copy) and an output with
contiguous rows; anything else (a zero extent, a stride cuBLAS cannot express, other dtypes than
float32 and float64) goes to CuPy's ``matmul``. ``tests/test_cublas_plan.py`` runs every plan through a
NumPy model of column-major ``gemm`` on the raw buffers. Before the first product of a process a probe
checks this path against CuPy's ``matmul`` (row-major, transposed and strided operands); if it fails,
the process warns once and uses CuPy's.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from typing import NamedTuple

import numpy as np

from ._env_mode import EnvMode
from .errors import HpsError

__all__ = ["MODES", "mode", "set_mode", "GemmPlan", "gemm_plan", "matmul", "column_sums", "probe"]

MODES = ("cupy", "cublas-gil", "cublas")
OP_N, OP_T = 0, 1  # cublasOperation_t
_INT_MAX = 2 ** 31 - 1
_lock = threading.Lock()
_state = {"checked": False, "lib": {}, "handles": {}, "ones": {}}
_ONE = {np.dtype(np.float32): ctypes.c_float(1.0), np.dtype(np.float64): ctypes.c_double(1.0)}
_ZERO = {np.dtype(np.float32): ctypes.c_float(0.0), np.dtype(np.float64): ctypes.c_double(0.0)}


class CublasError(HpsError):
    """A cuBLAS call returned an error status: the message names the call and the status."""


_MODE = EnvMode("HPS_CUDA_GEMM", MODES, "cupy", "product mode")


def mode() -> str:
    """The product mode of this process (``HPS_CUDA_GEMM``, default ``cupy``)."""
    return _MODE.get()


def set_mode(m: str) -> str:
    """Multiply through ``m`` (one of :data:`MODES`) from now on; returns it."""
    return _MODE.set(m)


# -- the plan: row-major arrays as cuBLAS's column-major gemm ---------------------------------------------
class GemmPlan(NamedTuple):
    """``gemm(transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)`` in cuBLAS's column-major
    terms, where cuBLAS's A is the buffer of the row-major product's ``b`` and its B that of ``a``."""

    transa: int
    transb: int
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int


def _as_column_major(shape, strides) -> tuple | None:
    """How cuBLAS can read a 2-D array of ``shape`` (r, c) and element ``strides``: ``(OP_N, ld)`` when its
    rows are contiguous (its buffer, column-major with leading dimension ``ld``, is the (c, r) transpose),
    ``(OP_T, ld)`` when its columns are (the buffer is the (r, c) array itself), else None."""
    (r, c), (s0, s1) = shape, strides
    if s1 == 1 or c == 1:
        ld = s0 if r > 1 else c
        if ld >= c:
            return OP_N, ld
    if s0 == 1 or r == 1:
        ld = s1 if c > 1 else r
        if ld >= r:
            return OP_T, ld
    return None


def gemm_plan(a_shape, a_strides, b_shape, b_strides, c_shape, c_strides) -> GemmPlan | None:
    """The cuBLAS ``gemm`` computing row-major ``c = a @ b`` (2-D; strides in elements), or None when
    cuBLAS cannot read the arrays in place (then multiply some other way). ``C^T = B^T A^T``: cuBLAS's
    first operand is the buffer of ``b``, which must read as ``b^T`` (k, n) -> (n, k); its second that
    of ``a``; ``c`` must have contiguous rows."""
    (m, k), (k2, n) = a_shape, b_shape
    if k != k2 or tuple(c_shape) != (m, n) or min(m, n, k) < 1:
        return None
    if min(*a_strides, *b_strides, *c_strides) < 0:
        return None
    la, lb = _as_column_major(a_shape, a_strides), _as_column_major(b_shape, b_strides)
    lc = _as_column_major(c_shape, c_strides)
    if la is None or lb is None or lc is None or lc[0] != OP_N:
        return None
    plan = GemmPlan(lb[0], la[0], n, m, k, lb[1], la[1], lc[1])
    return plan if max(plan[2:]) <= _INT_MAX else None


def _plan_of(a, b, out) -> GemmPlan | None:
    """:func:`gemm_plan` of device arrays ``a``, ``b`` and ``out`` of one dtype cuBLAS multiplies."""
    dt = out.dtype
    if a.ndim != 2 or b.ndim != 2 or out.ndim != 2 or dt not in _ONE or a.dtype != dt or b.dtype != dt:
        return None
    if out is a or out is b:
        return None
    isz = dt.itemsize
    strides = []
    for x in (a, b, out):
        s0, s1 = x.strides
        if s0 % isz or s1 % isz or _address(x) % isz:
            return None
        strides.append((s0 // isz, s1 // isz))
    return gemm_plan(a.shape, strides[0], b.shape, strides[1], out.shape, strides[2])


def _address(x) -> int:
    """The address of ``x``'s first element (a CuPy array's device pointer, a NumPy array's host one)."""
    return x.data.ptr if hasattr(x.data, "ptr") else x.ctypes.data


# -- the library ----------------------------------------------------------------------------------------
def _library_path() -> str:
    """The libcublas CuPy loaded (so both use one copy), else the soname for the loader to find."""
    try:
        import cupy

        cupy.cuda.device.get_cublas_handle()  # CuPy loads its libcublas (lazily, at its first use)
    except Exception:  # noqa: BLE001 - then the loader looks the soname up
        pass
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path).startswith("libcublas.so"):
                    return path
    except OSError:
        pass
    return "libcublas.so.12"


def _lib(hold_gil: bool):
    """cuBLAS through ctypes with the functions hps calls typed: ``PyDLL`` keeps the GIL, ``CDLL`` not."""
    lib = _state["lib"].get(hold_gil)
    if lib is None:
        lib = (ctypes.PyDLL if hold_gil else ctypes.CDLL)(_library_path())
        vp, i = ctypes.c_void_p, ctypes.c_int
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
        lib.cublasSetStream_v2.argtypes = [vp, vp]
        lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
        for name in ("cublasSgemm_v2", "cublasDgemm_v2"):
            getattr(lib, name).argtypes = [vp, i, i, i, i, i, vp, vp, i, vp, i, vp, vp, i]
        for fn in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2, lib.cublasSgemm_v2,
                   lib.cublasDgemm_v2):
            fn.restype = i
        _state["lib"][hold_gil] = lib
    return lib


def _check_status(status: int, call: str) -> None:
    if status:
        raise CublasError(f"{call} failed with cuBLAS status {status}; HPS_CUDA_GEMM=cupy multiplies through "
                          "CuPy instead")


#: The work space of hps's handle (cuBLAS's recommendation for Hopper; 4 MiB suffice before it).
WORKSPACE_BYTES = 32 << 20


class _Handle:
    """hps's cuBLAS handle on one device, its work space and the stream it was last set to.

    The work space is the handle's own, allocated once (outside any stream capture) and set again after
    every ``cublasSetStream`` (which goes back to cuBLAS's default pool): so a product captured into a
    CUDA graph (``hps/model/_graphs.py``) allocates nothing. REQUIRES the process's products not to
    execute on two streams at once (one work space): hps's one train thread makes them in stream order."""

    def __init__(self, lib):
        import cupy

        h = ctypes.c_void_p()
        _check_status(lib.cublasCreate_v2(ctypes.byref(h)), "cublasCreate_v2")
        self.ptr, self.stream = h.value, None
        self.workspace = cupy.empty(WORKSPACE_BYTES, cupy.uint8)

    def set_stream(self, lib, stream: int) -> None:
        _check_status(lib.cublasSetStream_v2(self.ptr, stream), "cublasSetStream_v2")
        _check_status(lib.cublasSetWorkspace_v2(self.ptr, self.workspace.data.ptr, WORKSPACE_BYTES),
                      "cublasSetWorkspace_v2")
        self.stream = stream


def _gemm(lib, a, b, out, plan: GemmPlan) -> None:
    """Enqueue ``plan`` on the current CuPy stream with hps's handle of the current device."""
    import cupy

    dev, stream = out.data.device_id, cupy.cuda.get_current_stream().ptr
    one, zero = _ONE[out.dtype], _ZERO[out.dtype]
    fn = lib.cublasSgemm_v2 if out.dtype == np.float32 else lib.cublasDgemm_v2
    with _lock:
        h = _state["handles"].get(dev)
        if h is None:
            with cupy.cuda.Device(dev):
                h = _state["handles"][dev] = _Handle(lib)
        if h.stream != stream:
            h.set_stream(lib, stream)
        status = fn(h.ptr, plan.transa, plan.transb, plan.m, plan.n, plan.k, ctypes.byref(one), b.data.ptr,
                    plan.lda, a.data.ptr, plan.ldb, ctypes.byref(zero), out.data.ptr, plan.ldc)
    _check_status(status, "cublasSgemm_v2" if out.dtype == np.float32 else "cublasDgemm_v2")


def _active() -> str | None:
    """The cuBLAS mode products take now, or None for CuPy's (the mode, or a failed probe)."""
    if _MODE.get() == "cupy" or not (_state["checked"] or _check()):
        return None
    m = _MODE.get()
    return None if m == "cupy" else m


def _gemm_if_planned(a, b, out) -> bool:
    """Enqueue ``out = a @ b`` through cuBLAS if a cuBLAS mode is on (its probe passed) and the arrays
    have a plan -> whether it did."""
    m = _active()
    plan = _plan_of(a, b, out) if m else None
    if plan is None:
        return False
    _gemm(_lib(m == "cublas-gil"), a, b, out, plan)
    return True


def matmul(a, b, out):
    """``out[...] = a @ b`` for 2-D CuPy arrays, asynchronous on the current stream -> ``out``: through
    cuBLAS (:func:`mode`) where :func:`gemm_plan` has a plan and the probe passed, else CuPy's
    ``matmul``. REQUIRES ``out`` not to overlap ``a`` or ``b``."""
    if _gemm_if_planned(a, b, out):
        return out
    import cupy

    return cupy.matmul(a, b, out=out)


def _ones(n: int, dtype, device: int):
    """A (1, n) row of ones on ``device`` (kept, and grown to twice the largest n asked so far)."""
    import cupy

    key = (device, np.dtype(dtype))
    row = _state["ones"].get(key)
    if row is None or row.shape[1] < n:
        with cupy.cuda.Device(device):
            row = cupy.ones((1, 2 * n), dtype)
            cupy.cuda.get_current_stream().synchronize()  # ready for whichever stream multiplies by it
        _state["ones"][key] = row
    return row[:, :n]


def column_sums(x, out):
    """``out[...] = x.sum(axis=0)`` for a 2-D CuPy array ``x`` (n, m) and ``out`` (m,) -> ``out``: in a
    cuBLAS mode the product of a row of ones and ``x`` (:func:`matmul`'s path: one ``gemm``, the GIL
    held in ``cublas-gil``), else CuPy's ``sum``. The same sums in another order: they agree to rounding."""
    if x.ndim == 2 and out.ndim == 1 and x.shape[0] and _active():
        if _gemm_if_planned(_ones(x.shape[0], x.dtype, x.data.device_id), x, out.reshape(1, -1)):
            return out
    return x.sum(axis=0, out=out)


# -- the probe --------------------------------------------------------------------------------------------
def probe(hold_gil: bool = True) -> str | None:
    """Multiply through cuBLAS as :func:`matmul` does and compare with CuPy's ``matmul``: row-major,
    transposed and strided operands, a strided output, both float types. None if they agree to
    rounding, else what differed. Needs a CUDA GPU and CuPy."""
    import cupy as cp

    lib = _lib(hold_gil)
    rng = np.random.default_rng(0)
    for dt in (np.float32, np.float64):
        x = cp.asarray(rng.standard_normal((70, 40)), dtype=dt)
        w = cp.asarray(rng.standard_normal((40, 30)), dtype=dt)
        v = cp.asarray(rng.standard_normal((30, 40)), dtype=dt)
        cases = {"x @ w": (x, w), "x.T @ x": (x[:, :33].T, x[:, 7:37]), "x @ v.T": (x, v.T),
                 "x[::2] @ w": (x[::2], w)}
        for name, (a, b) in cases.items():
            want = cp.matmul(a, b)
            got = cp.full((a.shape[0], b.shape[1] + 3), cp.nan, dtype=dt)[:, 1:b.shape[1] + 1]
            plan = _plan_of(a, b, got)
            if plan is None:
                return f"no cuBLAS plan for {name} of {np.dtype(dt).name}"
            _gemm(lib, a, b, got, plan)
            cp.cuda.get_current_stream().synchronize()
            if not bool(cp.allclose(got, want, rtol=1e-5, atol=1e-5)):
                return f"{name} of {np.dtype(dt).name} differs from cupy.matmul by {float(cp.abs(got - want).max())}"
    return None


def _check() -> bool:
    """Run :func:`probe` once per process; on failure warn once and use CuPy's ``matmul`` from then on."""
    with _lock:
        if _state["checked"]:
            return _MODE.get() != "cupy"
    try:
        wrong = probe(_MODE.get() == "cublas-gil")
    except Exception as e:  # noqa: BLE001 - any failure of the fast path means: use CuPy's
        wrong = f"{type(e).__name__}: {e}"
    with _lock:
        _state["checked"] = True
        if wrong is not None:
            warnings.warn(f"hps: the products through cuBLAS failed their check ({wrong}); multiplying through "
                          f"CuPy instead (HPS_CUDA_GEMM=cupy skips the check)", RuntimeWarning, stacklevel=3)
            _MODE.set("cupy")
            return False
    return True
