"""Launching hps's compiled Numba kernels with one ``cuLaunchKernel`` call (``hps._launch.launch``'s fast
path on a GPU).

Numba compiles and loads the kernels; this module only launches them. Numba's own launch goes through
``cuda.core``'s ``LaunchConfig`` and ``launch`` for every call; on an H200 its host cost inside the
training pipeline was ~0.5 ms a launch (``bench/results/gpu-h200-2026-11-27-night``) where a CuPy
kernel, one ``cuLaunchKernel`` call, cost ~26 us. Here a launch packs the kernel's parameters in
Numba's ABI into a per-thread buffer and calls the driver directly:

- an array argument of ``ndim`` d is ``5 + 2d`` parameters (meminfo, parent, size, itemsize, data
  pointer, shape, strides), a scalar one parameter of its Numba type's width; every parameter gets its
  own 8-byte slot (the driver reads each parameter's own width from its pointer);
  ``tests/test_gpu_ptx.py`` checks this layout against the PTX of every kernel;
- the overload is the one Numba compiled for the arguments' Numba types (a kernel's first launch with
  new types goes through Numba, which compiles it);
- the function handle is Numba's (``get_cufunc``), taken once per thread (no context lookup a launch):
  a ``CUkernel`` of CUDA 12's library API, which the driver loads into the context current at launch.

Modes (:func:`set_mode`, or ``HPS_CUDA_LAUNCH`` at import): ``driver-gil`` (the default: through
``ctypes.PyDLL``, the GIL held through the driver call), ``driver`` (``ctypes.CDLL``: the GIL released
during the call, as Numba's, ``cuda.core``'s and CuPy's driver calls do) and ``numba`` (Numba's launch).
Why hold the GIL: a call that hands it back while another thread runs Python gets it back only when that
thread is made to drop it, one switch interval later (``python -m bench.gil_convoy``: a ~65-us C call
beside a busy Python thread costs ~1.2 ms at a 0.001-s switch interval and ~5.3 ms at 0.005, against
~65 us holding the GIL); the training pipeline's prepare and place threads run Python beside the train
thread, which launches. A launch normally returns in microseconds; one that blocked (a full launch queue)
would hold every thread for as long, and no hps code takes the GIL inside the driver (no host callbacks).
Before the first driver launch of a process a probe kernel checks the path end to end (arrays of 1 and 2
dimensions, strided, every scalar kind); if it fails, the process warns once and launches through Numba.

Thread-safe: each thread packs into its own buffers, and the caches only grow under a lock.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import threading
import warnings

import numpy as np

from ._env_mode import EnvMode
from .errors import HpsError

__all__ = ["MODES", "mode", "set_mode", "param_layout", "pack_values", "Launcher", "launcher_for", "probe"]

MODES = ("driver-gil", "driver", "numba")
_lock = threading.Lock()
_check_lock = threading.Lock()
_state = {"checked": False, "lib": {}}
#: (dispatcher, the arguments' type keys: ``_arg_key``) -> Launcher, or None where the driver path does not apply
_launchers: dict = {}


class DriverLaunchError(HpsError):
    """``cuLaunchKernel`` returned an error: the message has the CUDA error code."""


_MODE = EnvMode("HPS_CUDA_LAUNCH", MODES, "driver-gil", "launch mode")


def mode() -> str:
    """The launch mode of this process (``HPS_CUDA_LAUNCH``, default ``driver-gil``)."""
    return _MODE.get()


def set_mode(m: str) -> str:
    """Launch through ``m`` (one of :data:`MODES`) from now on; returns it."""
    return _MODE.set(m)


# -- the parameter layout ----------------------------------------------------------------------------------
def _scalar_code(ty) -> str | None:
    """The struct code of a scalar parameter of Numba type ``ty`` in its 8-byte slot, or None."""
    name = str(ty)
    if name in ("bool", "boolean"):
        return "?7x"
    if name == "float32":
        return "f4x"
    if name == "float64":
        return "d"
    if re.fullmatch(r"u?int(8|16|32|64)", name):
        return "Q" if name.startswith("u") else "q"
    return None


def param_layout(argtypes) -> list | None:
    """Per kernel parameter, ``(struct code, width in bytes, kind)`` (kind ``"i"`` integer or pointer,
    ``"f"`` float) of a kernel compiled for Numba ``argtypes``; None if an argument is of a kind this
    module does not pack (Numba then launches it)."""
    out = []
    for ty in argtypes:
        if _is_array(ty):
            out += [("Q", 8, "i")] * (5 + 2 * int(ty.ndim))
            continue
        code = _scalar_code(ty)
        if code is None:
            return None
        bits = getattr(ty, "bitwidth", 8 if code == "?7x" else 64)
        out.append((code, max(1, int(bits) // 8), "f" if code in ("f4x", "d") else "i"))
    return out


def _array_fields(a) -> tuple:
    """(data pointer, shape, strides, size, itemsize) of a device array (Numba's, CuPy's, or any
    ``__cuda_array_interface__``)."""
    if getattr(a, "__cuda_ndarray__", False):  # Numba's DeviceNDArray
        return a.device_ctypes_pointer.value or 0, a.shape, a.strides, a.size, a.dtype.itemsize
    if type(a).__module__.split(".")[0] == "cupy":
        return a.data.ptr, a.shape, a.strides, a.size, a.itemsize
    d = a.__cuda_array_interface__
    dtype = np.dtype(d["typestr"])
    shape = tuple(d["shape"])
    strides = d.get("strides")
    if strides is None:  # C-contiguous
        strides, step = [], dtype.itemsize
        for n in reversed(shape):
            strides.append(step)
            step *= n
        strides = tuple(reversed(strides))
    size = int(np.prod(shape, dtype=np.int64)) if shape else 1
    return d["data"][0] or 0, shape, tuple(strides), size, dtype.itemsize


def _is_array(ty) -> bool:
    """Whether Numba type ``ty`` is an array's (it has ``ndim`` and a ``layout``)."""
    return getattr(ty, "ndim", None) is not None and hasattr(ty, "layout")


def pack_values(argtypes, args) -> list:
    """The values of every parameter of a kernel of Numba ``argtypes`` called with ``args``, in order."""
    return _values(tuple(_is_array(ty) for ty in argtypes), args)


def _values(arrays: tuple, args) -> list:
    vals = []
    for is_array, a in zip(arrays, args):
        if is_array:
            ptr, shape, strides, size, itemsize = _array_fields(a)
            vals += (0, 0, size, itemsize, ptr)
            vals += shape
            vals += strides
        else:
            vals.append(a)
    return vals


# -- the driver ---------------------------------------------------------------------------------------------
def _driver_call(hold_gil: bool):
    """``cuLaunchKernel`` through ctypes: ``PyDLL`` keeps the GIL during the call, ``CDLL`` releases it."""
    fn = _state["lib"].get(hold_gil)
    if fn is None:
        from ctypes.util import find_library

        name = "libcuda.so.1" if os.name == "posix" else (find_library("nvcuda") or "nvcuda")
        lib = (ctypes.PyDLL if hold_gil else ctypes.CDLL)(name)
        fn = lib.cuLaunchKernel
        u = ctypes.c_uint
        fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int
        _state["lib"][hold_gil] = fn
    return fn


class Launcher:
    """The driver launch of one compiled overload ``kernel`` (Numba's ``_Kernel``): its parameter layout
    and, per thread, a buffer of 8-byte slots, the array of pointers to them that the driver reads, and
    the kernel's handle. The handle is Numba's for the thread's context at its first launch there: a
    ``cuda.core`` kernel, a ``CUkernel`` of the CUDA 12 library API, which the driver loads into whatever
    context is current when it is launched (so a thread that moves between GPUs may keep it)."""

    def __init__(self, kernel, layout):
        self.kernel, self.argtypes = kernel, tuple(kernel.argument_types)
        self.struct = struct.Struct("<" + "".join(code for code, _, _ in layout))
        self.n = len(layout)
        self.arrays = tuple(_is_array(ty) for ty in self.argtypes)
        self._threads: dict = {}

    def _of_thread(self) -> tuple:
        tid = threading.get_ident()
        b = self._threads.get(tid)
        if b is None:
            if len(self._threads) >= 256:  # threads come and go: start afresh (a caller keeps its own)
                self._threads = {}
            n = max(self.n, 1)
            buf = ctypes.create_string_buffer(8 * n)
            base = ctypes.addressof(buf)
            ptrs = (ctypes.c_void_p * n)(*[base + 8 * i for i in range(n)])
            handle = int(self.kernel._codelibrary.get_cufunc().handle)
            b = self._threads[tid] = (buf, ptrs, handle)
        return b

    def __call__(self, grid, block, hstream: int, args, hold_gil: bool) -> None:
        buf, ptrs, handle = self._of_thread()
        self.struct.pack_into(buf, 0, *_values(self.arrays, args))
        rc = _driver_call(hold_gil)(handle, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, hstream,
                                    ptrs, None)
        if rc:
            raise DriverLaunchError(f"cuLaunchKernel of {self.kernel.entry_name} failed with CUDA error {rc}; "
                                    f"HPS_CUDA_LAUNCH=numba launches through Numba instead")


def _arg_key(a):
    """A key of ``a``'s Numba type as a kernel argument that is cheap to compute: an array's class,
    dtype, ndim and layout (Numba's rule: "C" or "F" if contiguous and not broadcast, else "A"), a
    scalar's class (a Python int only within int64, as Numba types it); None for what the driver path
    leaves to Numba (a host array, a wider int)."""
    cls = type(a)
    if cls is np.ndarray:  # a host array: Numba copies it to the device and back
        return None
    shape = getattr(a, "shape", None)
    if shape is None or cls.__module__ == "numpy":  # a Python or NumPy scalar
        if cls is int and not -(1 << 63) <= a < (1 << 63):
            return None
        return cls
    flags, strides = a.flags, a.strides
    if 0 in strides and a.size != 0:
        layout = "A"
    elif flags["C_CONTIGUOUS"]:
        layout = "C"
    elif flags["F_CONTIGUOUS"]:
        layout = "F"
    else:
        layout = "A"
    return type(a), a.dtype, len(shape), layout


def launcher_for(dispatcher, args):
    """The :class:`Launcher` of ``dispatcher``'s overload for ``args``, or None (not compiled for these
    types yet, a debug or cooperative kernel, or an argument kind this module does not pack)."""
    overloads = getattr(dispatcher, "overloads", None)
    if overloads is None:  # not a Numba CUDA dispatcher
        return None
    try:
        keys = tuple([_arg_key(a) for a in args])
    except Exception:  # noqa: BLE001 - an argument Numba types its own way: let Numba launch it
        return None
    if None in keys:
        return None
    key = (dispatcher, keys)
    hit = _launchers.get(key, False)
    if hit is not False:
        return hit
    from numba.cuda.typing.typeof import Purpose, typeof

    argtypes = tuple(typeof(a, Purpose.argument) for a in args)  # Numba's own typing, once per key
    kernel = overloads.get(argtypes)
    if kernel is None and getattr(dispatcher, "specialized", False) and len(overloads) == 1:
        kernel = next(iter(overloads.values()))
    if kernel is None:
        return None  # Numba compiles it on this launch; the next one finds it
    layout = None
    if not (getattr(kernel, "debug", False) or getattr(kernel, "cooperative", False)):
        layout = param_layout(kernel.argument_types)
    launcher = Launcher(kernel, layout) if layout is not None else None
    with _lock:
        _launchers[key] = launcher
    return launcher


def dim3(d) -> tuple:
    """A launch dimension (an int or a tuple of 1-3) as a 3-tuple."""
    if isinstance(d, tuple):
        return tuple(int(x) for x in d) + (1,) * (3 - len(d))
    return int(d), 1, 1


def stream_handle(s) -> int:
    """The ``CUstream`` of a stream as ``hps._launch.stream_of`` gives it: 0 (the legacy default stream)
    or a Numba stream (its handle: a cuda-bindings ``CUstream``, or a ctypes one in older Numba)."""
    if isinstance(s, int):
        return s
    h = s.handle
    return int(h.value or 0) if isinstance(h, ctypes.c_void_p) else int(h)


def launch(dispatcher, grid: tuple, block: tuple, hstream: int, args) -> bool:
    """Launch ``dispatcher`` on ``args`` (``grid`` and ``block`` 3-tuples, :func:`dim3`) through the driver
    if this process does and a launcher applies; False where the caller must launch through Numba."""
    m = mode()
    if m == "numba":
        return False
    launcher = launcher_for(dispatcher, args)
    if launcher is None:
        return False
    if not _state["checked"] and not _check():
        return False
    launcher(grid, block, hstream, args, m == "driver-gil")
    return True


def performance_warnings() -> tuple:
    """The classes of the small-grid warning a launch configuration may raise: numba-cuda's own
    (``numba.cuda.core.errors``, what its dispatcher raises since numba-cuda 0.2x) and Numba's (older
    numba-cuda and the simulator): two unrelated classes, so each is filtered."""
    found = []
    for module in ("numba.cuda.core.errors", "numba.core.errors"):
        try:
            found.append(__import__(module, fromlist=["NumbaPerformanceWarning"]).NumbaPerformanceWarning)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


# -- the probe ---------------------------------------------------------------------------------------------
_PROBE = {}


def _probe_kernel():
    k = _PROBE.get("k")
    if k is None:
        from ._xp import cuda_module

        cuda = cuda_module()

        @cuda.jit
        def probe_params(out, uout, a, b, i32, i64, u64, f32, f64, flag):
            if cuda.grid(1) == 0:
                out[0] = a.shape[0]
                out[1] = a.shape[1]
                out[2] = a.strides[0]
                out[3] = a.strides[1]
                out[4] = a[1, 2]
                out[5] = b[3]
                out[6] = i32
                out[7] = i64
                out[8] = f32
                out[9] = f64
                out[10] = 1.0 if flag else 2.0
                out[11] = b.shape[0]
                uout[0] = u64

        k = _PROBE["k"] = probe_params
    return k


def probe(hold_gil: bool = False) -> str | None:
    """Launch a probe kernel through the driver and check what it received; None if right, else what was
    wrong. Needs a CUDA GPU and CuPy. The first launch compiles through Numba; the second is checked."""
    import cupy as cp

    k = _probe_kernel()
    base = cp.arange(5 * 8, dtype=cp.float32).reshape(5, 8)
    a = base[:, ::2]  # (5, 4), strides (32, 8): a strided 2-D array
    b = cp.arange(10, dtype=cp.int64) * 3
    scalars = (np.int32(-7), np.int64(-(2 ** 40) + 3), np.uint64(2 ** 63 + 12345), np.float32(1.5),
               np.float64(-2.25), True)
    expect = [5, 4, 32, 8, float(a[1, 2]), 9, -7, -(2 ** 40) + 3, 1.5, -2.25, 1.0, 10]
    from ._xp import cuda_module

    def view(x):
        return cuda_module().as_cuda_array(x, sync=False)

    for attempt in range(2):
        out = cp.zeros(12, cp.float64)
        uout = cp.zeros(1, cp.uint64)
        args = (view(out), view(uout), view(a), view(b)) + scalars
        if attempt == 0:
            with warnings.catch_warnings():
                for category in performance_warnings():
                    warnings.simplefilter("ignore", category)
                k[1, 1, 0](*args)  # Numba compiles the overload and launches it once
            cp.cuda.Device().synchronize()
            continue
        launcher = launcher_for(k, args)
        if launcher is None:
            return "no launcher for the probe's overload"
        launcher((1, 1, 1), (1, 1, 1), 0, args, hold_gil)
        cp.cuda.Device().synchronize()
        got = [float(x) for x in out.get()]
        if got != [float(x) for x in expect]:
            return f"probe kernel read {got}, expected {expect}"
        if int(uout.get()[0]) != 2 ** 63 + 12345:
            return f"probe kernel read uint64 {int(uout.get()[0])}, expected {2 ** 63 + 12345}"
    return None


def _check() -> bool:
    """Run :func:`probe` once per process; on failure warn once and launch through Numba from then on."""
    with _check_lock:
        if _state["checked"]:
            return mode() != "numba"
        try:
            wrong = probe(mode() == "driver-gil")
        except Exception as e:  # noqa: BLE001 - any failure of the fast path means: use Numba's
            wrong = f"{type(e).__name__}: {e}"
        _state["checked"] = True
        if wrong is not None:
            warnings.warn(f"hps: launching kernels through cuLaunchKernel failed its check ({wrong}); "
                          f"launching through Numba instead (set HPS_CUDA_LAUNCH=numba to skip the check)",
                          RuntimeWarning, stacklevel=3)
            set_mode("numba")
            return False
        return True
