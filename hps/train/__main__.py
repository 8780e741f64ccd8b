"""``python -m hps.train``: see ``hps.train._main.main``.

The process keeps the garbage collector off what lives as long as it does. Python's cyclic collector
traces every container object of the generation it collects; the job's modules (NumPy, Numba, hps)
leave ~50,000 of them and loading the cached kernels ~60,000 more (Numba's typing and target
contexts), and the collections during the imports, every full one during the job and those of
interpreter shutdown would trace them again and again with nothing to free: about 0.3 CPU s of every
process, so of every rank of an MPI job. So the imports run with the collector off (the packages
``hps`` and ``hps.train`` import nothing heavy, so they all happen here), what they made is frozen
(``gc.freeze``: never traced again), and so is everything still alive when ``main`` returns.

Nothing is lost: objects the job creates and drops are collected as before; ``main`` has closed every
file and removed the job's temporary directories before it returns, and objects still alive at exit
are not promised a finalizer anyway (Python reference, ``object.__del__``).
"""

import gc
import sys

gc.disable()
try:
    from ._main import main
    from ._run import run  # noqa: F401  (imported by main on its first call: the job's modules load here)
finally:
    gc.freeze()
    gc.enable()
code = main()
gc.freeze()
sys.exit(code)
