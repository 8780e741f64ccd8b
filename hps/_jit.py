"""``njit``: Numba's ``njit`` for hps's CPU kernels, with a start-up cost that fits a rank process.

Every process of a job (each MPI rank) loads its kernels from Numba's on-disk cache; what that costs
is paid once per process, so N ranks pay it N times. Two parts of it are Numba's and not the kernels':

- **A cache per kernel, made at import.** ``numba.njit(cache=True)`` finds the kernel's cache directory
  at decoration, checks it is writable by creating a file there, and stamps the source file: about
  0.1 ms for each of hps's ~110 kernels, most of which a job never calls. Here the cache is made when
  the kernel is first compiled or loaded (:class:`_KernelCache`), so only the kernels a job calls pay.
- **The compiler's set-up at the first cache load.** Before every load Numba refreshes its target:
  it imports and installs every typing and lowering registry it has (NumPy's, linalg, typed
  containers, ...), about 0.1 CPU s at the first load of a process. Loading compiled code needs none of
  them: the code is machine code already linked against the runtime (NRT, whose symbols
  ``rtsys.initialize`` installs) and Numba's C helpers (installed when the CPU target is made); the
  one symbol table a registry import fills is the hash secret (``numba.cpython.hashing``), imported
  here. Compiling (a cache miss) still refreshes everything: Numba's compiler does so itself.

The compiled code, the cache files and their keys are Numba's own: a kernel behaves exactly as under
``numba.njit``, and a cache written by one is read by the other. Under ``NUMBA_DISABLE_JIT`` kernels
stay plain Python functions, as ``numba.njit`` leaves them.
"""

from __future__ import annotations

import numba
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher
from numba.core.runtime import rtsys


def njit(*, cache: bool = False, **options):
    """``numba.njit(**options)`` as a decorator (hps's kernels write ``@njit(nogil=True, cache=True)``);
    with ``cache=True`` the kernel is cached on disk as by Numba, through :class:`_KernelCache`."""
    jit = numba.njit(**options)

    def decorate(func):
        disp = jit(func)
        if cache and isinstance(disp, Dispatcher):  # not under NUMBA_DISABLE_JIT
            disp._cache = _KernelCache(func)  # what Dispatcher.enable_caching sets, made on first use
        return disp

    return decorate


class _KernelCache:
    """A kernel's on-disk cache: Numba's ``FunctionCache``, made on first use, whose loads skip the
    target refresh (see the module docstring). Used by the dispatcher under Numba's compiler lock."""

    def __init__(self, py_func):
        self._py_func = py_func
        self._cache = None

    def _made(self) -> FunctionCache:
        if self._cache is None:
            self._cache = FunctionCache(self._py_func)
        return self._cache

    def load_overload(self, sig, target_context):
        """The compiled overload of ``sig`` from disk, or None (a miss: the dispatcher compiles)."""
        cache = self._made()
        rtsys.initialize(target_context)  # the runtime the compiled code calls (idempotent)
        from numba.cpython import hashing  # noqa: F401  (installs the hash secret's symbols)

        with cache._guard_against_spurious_io_errors():
            return cache._load_overload(sig, target_context)

    def __getattr__(self, name):  # save_overload, flush, cache_path, ...: Numba's own
        if name.startswith("__") or name in ("_py_func", "_cache"):  # not made yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self._made(), name)
