"""What a process of a training job pays before its first example (issue #25): a drop-in for
``python -m hps.train`` that runs the job and prints, per process (each MPI rank), its CPU seconds by
phase and what its cached kernels' loads cost::

    python -m bench.startup_cpu --format criteo --data FILE ...             # one process
    mpiexec -n 4 python -m bench.startup_cpu --format criteo --data FILE ... # every rank

One line on stderr per process, at exit: ``[rank R] cpu <process CPU s> | imports <s> build <s>
warm-up <s> rest <s> | kernel loads <n> <CPU s>``. Phases are process CPU (every thread) between
marks: the interpreter and the job's imports (as ``hps.train.__main__`` does them: the garbage
collector off); until the Trainer is built (options, ``MPI_Init``, the readers, the first batch
parsed for the memory plan); the warm-up's scratch job; the rest (training, evaluation, the end).
Kernel loads: the thread CPU of every ``hps._jit`` load from Numba's cache, wherever it happens.
"""

import atexit
import gc
import os
import resource
import sys
import time

gc.disable()
try:
    from hps import _jit
    from hps.train import _warmup
    from hps.train._main import main
    from hps.train._run import run  # noqa: F401  (the job's modules, imported here as the job's __main__ does)
finally:
    gc.freeze()
    gc.enable()

MARKS = [("imports", time.process_time())]
LOADS = [0, 0.0]


def _mark(name: str) -> None:
    MARKS.append((name, time.process_time()))


def _timed_load(load):
    def timed(self, sig, target_context):
        t = time.thread_time()
        try:
            return load(self, sig, target_context)
        finally:
            LOADS[0] += 1
            LOADS[1] += time.thread_time() - t
    return timed


def _marked_warm_up(warm_up):
    def marked(trainer, log):
        _mark("build")
        try:
            return warm_up(trainer, log)
        finally:
            _mark("warm-up")
    return marked


def _report() -> None:
    _mark("rest")
    ru = resource.getrusage(resource.RUSAGE_SELF)
    phases, before = [], 0.0
    for name, at in MARKS:
        phases.append(f"{name} {at - before:.3f}")
        before = at
    rank = os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    print(f"[rank {rank}] cpu {ru.ru_utime + ru.ru_stime:.3f} | {' '.join(phases)} | kernel loads {LOADS[0]} "
          f"{LOADS[1]:.3f}", file=sys.stderr)


if hasattr(_jit, "_KernelCache"):
    _jit._KernelCache.load_overload = _timed_load(_jit._KernelCache.load_overload)
_warmup.warm_up = _marked_warm_up(_warmup.warm_up)  # the module the Trainer calls it from
atexit.register(_report)

if __name__ == "__main__":
    sys.argv[0] = "hps.train"
    code = main()
    gc.freeze()
    sys.exit(code)
