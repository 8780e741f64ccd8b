"""How many threads the BLAS library (OpenBLAS, MKL: NumPy's matrix products) may use during training.

The dense model's matrix products run in the BLAS thread pool while the other pipeline stages
(prepare, place, the SSD-PS I/O threads) run on the same cores. A pool as large as the machine then
competes with them: its threads spin waiting for work and get descheduled mid-product. On the 2-core
VM the larger-than-DRAM job (``python -m bench.bench_train scale``) trains 35 % faster with one BLAS
thread than with two (docs/training.md, "--blas-threads"). ``--blas-threads N`` sets the pool; the default is this
rank's share of the node's cores minus one for the other stages, at least 1. The cap holds for the
job's training (``threadpoolctl``, process-wide) and is lifted when it ends.
"""

from __future__ import annotations

import contextlib

from ..errors import InvalidInputError

__all__ = ["blas_threads", "limit_blas"]


def blas_threads(requested: int | None, cores_per_rank: int) -> int:
    """The BLAS pool size: ``requested``, else ``cores_per_rank - 1`` (at least 1)."""
    if requested is None:
        return max(1, int(cores_per_rank) - 1)
    if int(requested) != requested or requested < 1:
        raise InvalidInputError(f"--blas-threads must be a positive integer, got {requested!r}")
    return int(requested)


def limit_blas(n: int):
    """Context manager: the BLAS libraries NumPy loaded use at most ``n`` threads in the block."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # an install without it: BLAS keeps its own default
        return contextlib.nullcontext()
    return threadpool_limits(limits=int(n), user_api="blas")
