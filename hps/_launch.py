"""The one launch helper of hps's CUDA kernels: the table's (``hps/table/_cuda.py``) and GPU training's
(``hps/gpu/_train_ops.py``, ``_row_ops.py``, ``_partition_ops.py``).

- :func:`cuda` is ``hps._xp.cuda_module``: numba-cuda imported once, a failure turned into one typed
  line saying what to install (numba-cuda 0.30 does not import under NumPy >= 2.5).
- Launch shapes fill the device: every kernel loops grid-stride, and a launch takes
  ``min(ceil(work / per block), BLOCKS_PER_SM * SMs)`` blocks (HierarchicalKV's and CUB's rule), so a
  small batch takes the few blocks it needs and a large one keeps every SM busy without millions of
  blocks. :func:`grid1` is one thread per item; :func:`grid_rows` a 2-D block ``(bx, by)`` whose
  ``bx`` threads stride a row's columns (coalesced) and ``by`` rows share a block.
- :func:`launch` enqueues a kernel on a stream through a cache of launch configurations (no
  ``kernel[grid, block, stream]`` object per call), on a GPU with one ``cuLaunchKernel`` call
  (``hps._driver_launch``) once Numba has compiled the kernel for the arguments' types; Numba's
  ``NumbaPerformanceWarning`` about small grids is filtered there, where hps launches, when a
  configuration is first made (a grid smaller than Numba's threshold is what a small batch needs),
  never globally.
- :func:`stream_of` accepts 0 / None (the legacy default stream), a Numba stream, or a CuPy stream;
  :func:`view` makes a zero-copy Numba view of any ``__cuda_array_interface__`` array.

Under Numba's CUDA simulator there are no SMs: a launch takes at most ``SIM_MAX_BLOCKS`` blocks, so
the simulator tests walk the grid-stride loops more than once.

Thread-safe (the caches are guarded by a lock; under the simulator launches are serialised); configurations
are immutable once made.
"""

from __future__ import annotations

import sys
import threading
import warnings

import numpy as np

from . import _driver_launch as _driver
from ._driver_launch import performance_warnings
from ._xp import cuda_module as cuda
from ._xp import simulated
from .errors import InvalidInputError, InvalidTypeError

__all__ = ["cuda", "arg", "check_len", "grid1", "grid_rows", "launch", "stream_of", "view", "synchronize", "event"]

#: Threads per block of every launch (simulator tests patch it small so tiny inputs span several blocks).
BLOCK_SIZE = 256
#: Resident blocks aimed at per SM; grid-stride loops cover the rest of the work.
BLOCKS_PER_SM = 8
#: Most blocks of a launch under the CUDA simulator (no SMs there; small so loops iterate).
SIM_MAX_BLOCKS = 4
#: Launch configurations kept (kernel x grid x stream); past it the cache starts afresh.
_CACHE_LIMIT = 4096

_lock = threading.Lock()
#: Under the CUDA simulator every launch runs under this lock: the simulator keeps one global kernel
#: context ("no support for concurrent kernel launch"), and a kernel launched while another runs is run as
#: a device function in the other's context (its indices, its shared arrays). On a GPU launches are
#: asynchronous and need no lock. (A job's threads launch kernels of several tables and stages; a 2-rank
#: HET job failed in the simulator once its train stage switched threads every millisecond.)
_sim_lock = threading.RLock()
_sms: dict = {}
_configs: dict = {}
_external: dict = {}
_default: dict = {}  # 0 -> Numba's default stream object (``synchronize``)


# -- launch shapes ----------------------------------------------------------------------------------------
def _max_blocks() -> int:
    """Most blocks a launch takes: BLOCKS_PER_SM x the current device's SMs (cached per device)."""
    if simulated():
        return SIM_MAX_BLOCKS
    module = cuda()
    dev = module.get_current_device()
    n = _sms.get(dev.id)
    if n is None:
        n = _sms[dev.id] = int(dev.MULTIPROCESSOR_COUNT)
    return BLOCKS_PER_SM * n


def _blocks(n_items: int, per_block: int) -> int:
    return max(1, min((int(n_items) + per_block - 1) // per_block, _max_blocks()))


def _next_pow2(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


def grid1(n: int):
    """(blocks, threads) of a 1-D grid-stride kernel over ``n`` items."""
    return _blocks(n, BLOCK_SIZE), BLOCK_SIZE


def grid_rows(n: int, width: int):
    """(blocks, (bx, by)) of a row kernel over ``n`` items of ``width`` columns: bx threads stride a
    row's columns, by items per block, blocks stride the items."""
    bx = min(32, _next_pow2(width), BLOCK_SIZE)
    by = max(1, BLOCK_SIZE // bx)
    return _blocks(n, by), (bx, by)


# -- streams and arrays ---------------------------------------------------------------------------------
def stream_of(stream):
    """A stream Numba launches on: 0 for None / 0 (the legacy default stream), a Numba stream as is, a
    CuPy stream wrapped by its pointer (cached)."""
    if stream is None or (isinstance(stream, int) and stream == 0):
        return 0
    if type(stream).__module__.split(".")[0] == "cupy":
        ptr = stream.ptr
        if ptr == 0:
            return 0
        with _lock:
            s = _external.get(ptr)
            if s is None:
                s = _external[ptr] = cuda().external_stream(ptr)
        return s
    return stream


def synchronize(stream) -> None:
    """Block until the work enqueued on ``stream`` (as :func:`stream_of` takes it) is done. Numba's
    default stream object is made once (``default_stream()`` looks the context up and builds a new
    one per call; its handle, 0, names the current context's default stream wherever it is used)."""
    s = stream_of(stream)
    if s == 0:
        s = _default.get(0)
        if s is None:
            s = _default[0] = cuda().default_stream()
    s.synchronize()


def event():
    """A CUDA event without timing (the simulator's takes no arguments)."""
    return cuda().event() if simulated() else cuda().event(timing=False)


def view(x):
    """A Numba device array viewing ``x`` zero-copy if ``x`` lives on the GPU (a Numba device array, the
    simulator's, or any ``__cuda_array_interface__`` array), else None; no wait for the stream the
    producer exported (a blocking consumer orders itself after it: ``hps.table._cuda_alloc``)."""
    if getattr(x, "__cuda_ndarray__", False):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return cuda().as_cuda_array(x, sync=False)
    return None


def arg(x, name: str, dtype=None, ndim: int | None = None):
    """The device array a kernel takes for argument ``x`` (zero-copy, no sync: order your streams),
    after checking dtype and ndim. A host array is refused rather than silently copied, except under
    the CUDA simulator, where NumPy arrays stand for device arrays (the seam of ``hps._xp``)."""
    d = view(x)
    if d is None:
        if not (isinstance(x, np.ndarray) and simulated()):
            raise InvalidTypeError(f"{name} must be a device array (CuPy or Numba; NumPy only under the CUDA "
                                   f"simulator), got {type(x).__name__}: upload it with TransferLedger.to_device")
        d = x
    if ndim is not None and d.ndim != ndim:
        raise InvalidInputError(f"{name} must be {ndim}-D, got shape {tuple(d.shape)}")
    if dtype is not None and d.dtype != np.dtype(dtype):
        raise InvalidTypeError(f"{name} must be {np.dtype(dtype)}, got {d.dtype}")
    return d


def check_len(a, n: int, name: str, what: str) -> None:
    """Raise InvalidInputError unless ``a`` has ``n`` rows (``what`` says why)."""
    if a.shape[0] != n:
        raise InvalidInputError(f"{name} must have {n} rows ({what}), got shape {tuple(a.shape)}")


# -- launching ---------------------------------------------------------------------------------------------
_sim_shared_locked = False


def _lock_simulator_shared_arrays() -> None:
    """Make the CUDA simulator's ``cuda.shared.array`` allocate under a lock. It finds a block's array by
    its call site and makes one when there is none, without a lock: two of a block's threads (Python
    threads) switched between the find and the store each get an array of their own, and a thread then
    reads cells no other thread wrote (np.empty's garbage). With the threads switching every 10 us
    ``tests/cudasim/test_launch_threads_cudasim.py`` met it in ~1 run of 4; a job's cuda switch interval
    (1 ms) makes it rarer, not impossible: CI's failure of the 2-rank HET simulator job (a garbage index
    in the table's ``get`` kernel, whose slots pass through a shared array), put down to concurrent
    launches in e3d72c1, may have been this. Same call-site key (file, line) as the simulator's."""
    global _sim_shared_locked
    try:
        from numba.cuda.simulator import kernelapi
    except ImportError:  # pragma: no cover - another simulator layout: leave it as it is
        _sim_shared_locked = True
        return
    cls, lock = kernelapi.FakeCUDAShared, threading.Lock()
    unlocked = cls.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory (one buffer), or refused
            return unlocked(self, shape, dtype, alignment)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        if isinstance(dtype, kernelapi.types.Type):
            dtype = kernelapi.numpy_support.as_dtype(dtype)
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res

    cls.array = array
    _sim_shared_locked = True


def launch(kernel, shape, stream, *args) -> None:
    """Enqueue ``kernel(*args)`` with launch ``shape`` = (blocks, threads) from :func:`grid1` /
    :func:`grid_rows` on ``stream`` (:func:`stream_of` form). Asynchronous. On a GPU a compiled kernel is
    launched with one driver call (``hps._driver_launch``; ``HPS_CUDA_LAUNCH=numba``: through Numba);
    its first launch with new argument types goes through Numba, which compiles it."""
    blocks, threads = shape
    s = stream_of(stream)
    key = (kernel, blocks, threads, s)  # holds the stream: a live key never names a freed stream
    cfg = _configs.get(key)
    if cfg is None:
        with _lock, warnings.catch_warnings():
            for category in performance_warnings():
                warnings.simplefilter("ignore", category)
            cfg = (kernel[blocks, threads, s], None if simulated() else _driver.stream_handle(s),
                   _driver.dim3(blocks), _driver.dim3(threads))
            if len(_configs) >= _CACHE_LIMIT:
                _configs.clear()
            _configs[key] = cfg
    if cfg[1] is None:  # the simulator
        with _sim_lock:
            if not _sim_shared_locked:
                _lock_simulator_shared_arrays()
            cfg[0](*args)
    elif not _driver.launch(kernel, cfg[2], cfg[3], cfg[1], args):
        cfg[0](*args)
