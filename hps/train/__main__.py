"""``python -m hps.train``: see ``hps.train._main.main``.

The process keeps the garbage collector off what lives as long as it does (``gc.freeze``): the
modules, once imported, and everything still alive when ``main`` returns. Python's cyclic collector
traces every container object of the generation it collects; the imports leave ~50,000 of them
(NumPy, Numba, hps), loading the cached kernels ~60,000 more (Numba's typing and target contexts),
and every full collection during the job, and those interpreter shutdown runs, would trace them all
again with nothing to free — about 0.25 CPU s of every process, so of every rank of an MPI job.
Nothing is lost: objects the job creates and drops are collected as before; ``main`` has closed every
file and removed the job's temporary directories before it returns, and objects still alive at exit
are not promised a finalizer anyway (Python reference, ``object.__del__``).
"""

import gc
import sys

from ._main import main

gc.freeze()
code = main()
gc.freeze()
sys.exit(code)
