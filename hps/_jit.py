"""``njit``: Numba's ``njit`` for hps's CPU kernels, with a start-up cost that fits a rank process.

Every process of a job (each MPI rank) loads its kernels from Numba's on-disk cache; what that costs
is paid once per process, so N ranks pay it N times. Four parts of it are Numba's, not the kernels':

- **A cache per kernel, made at import.** ``numba.njit(cache=True)`` finds the kernel's cache directory
  at decoration, checks it is writable by creating a file there, and stamps the source file: about
  0.1 ms for each of hps's ~110 kernels, most of which a job never calls. Here the cache is made when
  the kernel is first compiled or loaded (:class:`_KernelCache`), so only the kernels a job calls pay.
- **The compiler's set-up at the first cache load.** Before every load Numba refreshes its target:
  it imports and installs every typing and lowering registry it has (NumPy's, linalg, typed
  containers, ...), about 0.1 CPU s at the first load of a process. Loading compiled code needs none of
  them: the code is machine code already linked against the runtime (NRT, whose symbols
  ``rtsys.initialize`` installs) and Numba's C helpers (installed when the CPU target is made); the
  one symbol table a registry import fills is the hash secret (``numba.cpython.hashing``, ~9 ms),
  imported here when a loaded kernel's code refers to it (:data:`HASH_SECRET`). Compiling (a cache
  miss) still refreshes everything: Numba's compiler does so itself.
- **The kernel's IR, parsed at every load.** Numba's cache holds a kernel's machine code and its LLVM
  IR (bitcode), which a later compile links in if it calls the kernel; at every load Numba parses that
  IR and scans it for the symbols it defines, about 1.2 ms a kernel, for the one symbol a load looks up
  (the kernel's Python wrapper). Here the IR is parsed when a compile first links it
  (:class:`_CachedLibrary`) and the wrapper is found among the machine code's symbol names.
- **Numba's library modules, imported to rebuild environments.** A cached kernel holds the environment
  (constants and the module's globals) of every function compiled into it, Numba's own among them: a
  kernel calling ``np.full`` or ``np.argsort`` carries environments of ``numba.np.arrayobj`` or
  ``numba.np.arraymath``, and Numba imports that module at the load to take its globals (about
  40 ms each for those two, with what they import, in every process). Only object mode reads an
  environment's globals; hps's kernels are nopython, whose code reads the constants alone. Here an
  environment of a module not imported yet gets a stand-in for its globals holding the module's name
  (:func:`_rebuild_env`), so a later save of the environment names the same module, as Numba's does.

The compiled code, the cache files and their keys are Numba's own: a kernel behaves exactly as under
``numba.njit``, and a cache written by one is read by the other. Under ``NUMBA_DISABLE_JIT`` kernels
stay plain Python functions, as ``numba.njit`` leaves them.
"""

from __future__ import annotations

import os
import pickle
import sys

import llvmlite.binding as ll
import numba

try:  # Numba's internals this module relies on (checked on Numba 0.68)
    from numba.core import environment
    from numba.core.caching import FunctionCache, IndexDataCacheFile, _cache_log
    from numba.core.codegen import JITCodeLibrary, JitEngine
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.dispatcher import Dispatcher
    from numba.core.runtime import rtsys
except ImportError:  # pragma: no cover - another Numba: plain numba.njit (see fits_numba)
    FunctionCache = IndexDataCacheFile = JITCodeLibrary = JitEngine = Dispatcher = environment = object

#: How the names of Numba's Python wrappers of compiled functions begin (``FunctionDescriptor.
#: llvm_cpython_wrapper_name``, Itanium-mangled in the ``cpython`` namespace): a library's own symbols.
WRAPPER_PREFIX = "_ZN7cpython"


#: How the names of the hash secret's symbols begin (``numba.cpython.hashing`` installs them at import),
#: as a kernel's machine code that refers to them holds them.
HASH_SECRET = b"_numba_hashsecret_"

#: ``HPS_PLAIN_NJIT=1``: every kernel made by ``numba.njit`` itself (what this module changes, turned off)
PLAIN_ENV = "HPS_PLAIN_NJIT"


def fits_numba() -> bool:
    """Whether the installed Numba has every internal this module uses; otherwise (or with
    ``HPS_PLAIN_NJIT=1``) :func:`njit` is plain ``numba.njit``: slower to start, the same kernels."""
    return (os.environ.get(PLAIN_ENV, "") in ("", "0")
            and all(hasattr(FunctionCache, a) for a in ("_load_overload", "_guard_against_spurious_io_errors"))
            and all(hasattr(JITCodeLibrary, a) for a in ("_set_compiled_object", "_finalize_final_module",
                                                         "enable_object_caching", "_unserialize"))
            and all(hasattr(JitEngine, a) for a in ("_load_defined_symbols", "is_symbol_defined"))
            and all(hasattr(IndexDataCacheFile, a) for a in ("_load_data", "_data_path"))
            and all(hasattr(environment, a) for a in ("_rebuild_env", "lookup_environment", "Environment")))


_FITS = fits_numba()


def njit(*, cache: bool = False, **options):
    """``numba.njit(**options)`` as a decorator (hps's kernels write ``@njit(nogil=True, cache=True)``);
    with ``cache=True`` the kernel is cached on disk as by Numba, through :class:`_KernelCache` (or by
    Numba itself where :func:`fits_numba` is false)."""
    if not _FITS:
        return numba.njit(cache=cache, **options)
    jit = numba.njit(**options)

    def decorate(func):
        disp = jit(func)
        if cache and isinstance(disp, Dispatcher):  # not under NUMBA_DISABLE_JIT
            disp._cache = _KernelCache(func)  # what Dispatcher.enable_caching sets, made on first use
        return disp

    return decorate


class _KernelCache:
    """A kernel's on-disk cache: Numba's ``FunctionCache``, made on first use, whose loads skip the
    target refresh (see the module docstring). The dispatcher calls it (``load_overload``,
    ``save_overload``, ``flush``, ``cache_path``) under Numba's compiler lock."""

    def __init__(self, py_func):
        self._py_func = py_func
        self._cache = None

    def _made(self) -> FunctionCache:
        if self._cache is None:
            cache = FunctionCache(self._py_func)
            files = cache._cache_file  # its data files are read by _load_data (Numba's, but for environments)
            files._load_data = lambda name: _load_data(files, name)
            self._cache = cache
        return self._cache

    def load_overload(self, sig, target_context):
        """The compiled overload of ``sig`` from disk, or None (a miss: the dispatcher compiles)."""
        cache = self._made()
        rtsys.initialize(target_context)  # the runtime the compiled code calls (idempotent)
        codegen = target_context.codegen()
        with global_compiler_lock, cache._guard_against_spurious_io_errors():
            codegen._library_class = _CachedLibrary  # the loaded library's class (shadows the codegen's)
            try:
                return cache._load_overload(sig, target_context)
            finally:
                del codegen._library_class

    # the rest of what the dispatcher asks of its cache: Numba's own
    def save_overload(self, sig, data):
        self._made().save_overload(sig, data)

    def flush(self):
        self._made().flush()

    @property
    def cache_path(self) -> str:
        return self._made().cache_path


class _Unpickler(pickle.Unpickler):
    """Numba's cache data as ``pickle.loads`` reads it, but environments are rebuilt by :func:`_rebuild_env`."""

    def find_class(self, module, name):
        if module == "numba.core.environment" and name == "_rebuild_env":
            return _rebuild_env
        return super().find_class(module, name)


def _load_data(files, name: str):
    """``IndexDataCacheFile._load_data`` (a kernel's cache data file ``name`` -> its contents), with
    :class:`_Unpickler`."""
    path = files._data_path(name)
    with open(path, "rb") as f:
        data = _Unpickler(f).load()
    _cache_log("[cache] data loaded from %r", path)
    return data


def _rebuild_env(modname, consts, env_name):
    """Numba's ``_rebuild_env`` (the environment ``env_name`` of a function of module ``modname``,
    holding the constants ``consts``), except that a module not imported yet is not imported: the
    environment's globals are a stand-in naming it (see the module docstring)."""
    mod = sys.modules.get(modname)
    if mod is not None or environment.lookup_environment(env_name) is not None:
        return environment._rebuild_env(modname, consts, env_name)
    env = environment.Environment({"__name__": modname})
    env.consts[:] = consts
    env.env_name = env_name
    environment.Environment._memo[env_name] = env
    return env


class _CachedLibrary(JITCodeLibrary):
    """A kernel's code loaded from Numba's cache whose IR is parsed when first needed (see the module
    docstring); otherwise Numba's ``JITCodeLibrary``. Used under Numba's compiler lock."""

    def __init__(self, codegen, name):
        self._bitcode = None   # the IR not parsed yet
        self._machine = None   # the machine code's bytes, until the wrapper is looked up
        super().__init__(codegen, name)

    @property
    def _shared_module(self):
        """The IR for linking (Numba's attribute), parsed on first use with Numba's symbol scan."""
        if self._shared is None and self._bitcode is not None:
            self._shared = ll.parse_bitcode(self._bitcode)
            self._bitcode = None
            self._codegen._engine._load_defined_symbols(self._shared)
        return self._shared

    @_shared_module.setter
    def _shared_module(self, module):
        self._shared = module

    @classmethod
    def _unserialize(cls, codegen, state):
        name, kind, data = state
        if kind != "object" or HASH_SECRET in data[0]:  # the code may read the hash secret: install it
            from numba.cpython import hashing  # noqa: F401  (its import installs the symbols)
        if kind != "object":  # Numba's way (its libraries are made by codegen, as this class now)
            return super()._unserialize(codegen, state)
        machine, bitcode = data
        self = cls(codegen, name)
        self.enable_object_caching()
        self._set_compiled_object(machine)
        self._bitcode, self._machine = bitcode, machine
        self._finalize_final_module()
        return self

    def get_pointer_to_function(self, name):
        engine = self._codegen._engine
        if self._bitcode is not None and not engine.is_symbol_defined(name):
            if name.startswith(WRAPPER_PREFIX) and self._machine is not None and name.encode() in self._machine:
                engine._defined_symbols.add(name)  # what Numba's scan of the IR would have found
                self._machine = None
            else:
                self._shared_module  # noqa: B018  (parse and scan the IR, as Numba does at load)
        return super().get_pointer_to_function(name)
