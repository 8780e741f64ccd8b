"""``hps._jit.njit``: kernels cached on disk as by ``numba.njit(cache=True)``, whose cache is made on
first use and whose loads from the cache skip the compiler's set-up (Numba's target refresh), parse
the kernel's IR only when a later compile links it, import no Numba module only to rebuild an
environment, and install the hash secret only for a kernel whose code reads it."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

KERNEL = textwrap.dedent("""\
    import numpy as np
    from hps._jit import njit


    @njit(nogil=True, cache=True, inline="always")
    def _twice(x):
        return 2 * x


    @njit(nogil=True, cache=True)
    def total(a):
        s = 0.0
        for i in range(a.shape[0]):
            s += _twice(a[i])
        return s, np.sort(a)


    @njit(nogil=True, cache=True)
    def helper(a):
        return a.sum()


    @njit(nogil=True, cache=True)
    def hashed(s):  # a str's hash reads Python's hash secret (numba.cpython.hashing installs its symbols)
        return hash(s)


    @njit(nogil=True)
    def fresh(a):  # not cached: compiled in every process, linking helper's code (loaded from the cache),
        return helper(a) + 1.0 + np.sort(a)[0]  # and np.sort, whose environment a load of total made
    """)

ROOT = str(Path(__file__).resolve().parents[1])

#: Numba's modules whose functions' environments a load of ``total`` rebuilds (np.sort's): not imported.
ENV_ONLY = ("numba.np.arraymath", "numba.np.arrayobj")
#: Modules only Numba's target refresh (its compiler's set-up) imports.
REFRESH_ONLY = ENV_ONLY + ("numba.typed.typedlist", "numba.np.random.generator_core",
                           "numba.np.polynomial.polynomial_core", "numba.cpython.printimpl")
#: What a CPU training job whose kernels all come from the cache never imports.
JOB_SKIPS = REFRESH_ONLY + ("numba.cpython.hashing",)

RUN = textwrap.dedent(f"""\
    import sys
    import numpy as np
    import cachedkernel as k
    made = k.total._cache._cache is not None
    s, srt = k.total(np.array([3.0, 1.0, 2.0]))
    assert s == 12.0 and srt.tolist() == [1.0, 2.0, 3.0], (s, srt)
    assert k.helper(np.arange(4.0)) == 6.0
    hashing = "numba.cpython.hashing" in sys.modules  # no kernel loaded so far reads the hash secret
    assert k.hashed("abc") == hash("abc")
    st = k.total.stats
    print("HASHING", hashing, "MADE", made, "HITS", sum(st.cache_hits.values()), "MISSES", sum(st.cache_misses.values()),
          "REFRESH", sorted(m for m in {REFRESH_ONLY!r} if m in sys.modules))
    print("FRESH", k.fresh(np.arange(4.0)))
    """)


def _run(tmp_path) -> str:
    proc = subprocess.run([sys.executable, "-c", RUN], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_kernel_compiles_once_then_loads_from_the_cache_without_the_compilers_set_up(tmp_path):
    (tmp_path / "cachedkernel.py").write_text(KERNEL)
    first = _run(tmp_path)
    assert "MADE False HITS 0 MISSES 1" in first, first  # the cache is made at the first call, not at import
    second = _run(tmp_path)
    assert "HASHING False MADE False HITS 1 MISSES 0 REFRESH []" in second, second
    assert "FRESH 7.0" in first and "FRESH 7.0" in second  # a compile links a kernel loaded from the cache
    assert any(p.suffix == ".nbi" for p in (tmp_path / "__pycache__").iterdir())  # Numba's own cache files


def test_numba_disable_jit_leaves_kernels_plain_functions():
    code = ("from hps._jit import njit\n"
            "f = njit(nogil=True, cache=True)(lambda x: x + 1)\n"
            "assert f(1) == 2 and not hasattr(f, 'py_func')\nprint('OK')\n")
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_every_cpu_kernel_of_hps_is_made_by_hps_jit():
    """A kernel made by ``numba.njit`` directly would bring back the set-up at its first load."""
    package = Path(ROOT) / "hps"
    direct = [str(p.relative_to(package)) for p in package.rglob("*.py") if p.name != "_jit.py"
              and any(s in p.read_text() for s in ("from numba import njit", "numba.njit(", "@numba.njit",
                                                    "from numba import jit", "numba.jit("))]
    assert not direct, direct


def test_a_job_loads_its_cached_kernels_without_the_compilers_set_up(tmp_path):
    """The second of two identical jobs finds every kernel in Numba's cache (the first compiled what was
    missing) and never runs the set-up of Numba's compiler: ~0.1 CPU s of every rank process."""
    code = ("import atexit, runpy, sys\n"   # (and no kernel of the job reads the hash secret)
            f"atexit.register(lambda: print('REFRESH', sorted(m for m in {JOB_SKIPS!r} if m in sys.modules)))\n"
            "sys.argv = ['hps.train', '--rows', '2000', '--batch-size', '512', '--minibatch-size', '256',\n"
            "            '--embedding-dim', '4', '--hidden', '8', '--no-progress']\n"
            "runpy.run_module('hps.train', run_name='__main__', alter_sys=True)\n")
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=tmp_path, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFRESH []" in proc.stdout, proc.stdout[-2000:]


def test_hps_plain_njit_makes_every_kernel_numbas_own(tmp_path):
    """``HPS_PLAIN_NJIT=1`` (or a Numba without the internals ``hps._jit`` uses) gives Numba's own
    ``njit``: its cache made at decoration, the same results."""
    (tmp_path / "cachedkernel.py").write_text(KERNEL)
    code = ("import numpy as np\nfrom numba.core.caching import FunctionCache\nfrom hps import _jit\n"
            "import cachedkernel as k\n"
            "assert not _jit.fits_numba() and isinstance(k.total._cache, FunctionCache), type(k.total._cache)\n"
            "assert k.total(np.array([3.0, 1.0, 2.0]))[0] == 12.0\nprint('OK')\n")
    env = {**os.environ, "HPS_PLAIN_NJIT": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
