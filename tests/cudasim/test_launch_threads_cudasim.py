"""Threads under the CUDA simulator (``hps._launch``): two host threads launching kernels at once (the
simulator keeps one global kernel context, "no support for concurrent kernel launch", so without
``_sim_lock`` a kernel launched while another runs is run as a device function in the other's context:
an error, or the other launch's indices and shared arrays), and a block's threads allocating their shared
array (the simulator's ``cuda.shared.array`` finds-then-stores without a lock: two threads can each get
an array of their own, then read cells nobody wrote)."""

import sys
import threading

import numpy as np
import pytest
from numba import cuda

from hps import _launch as L

pytestmark = pytest.mark.cudasim


def _ids_through_shared(out):
    """out[i] = i through the block's shared array (as the table's ``get`` kernel passes slots)."""
    cell = cuda.shared.array(64, dtype=np.int64)
    t = cuda.threadIdx.x
    cell[t] = cuda.grid(1)
    cuda.syncthreads()
    i = cuda.blockIdx.x * cuda.blockDim.x + (cuda.blockDim.x - 1 - t)   # a neighbour's cell
    out[i] = cell[cuda.blockDim.x - 1 - t]


#: two kernels of one module and one function: two dispatchers, as two tables' kernels are
_write_ids = cuda.jit(_ids_through_shared)
_write_ids_too = cuda.jit(_ids_through_shared)


def test_concurrent_launches_of_one_module_each_see_their_own_shared_arrays():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the job's threads switch often: the race comes at once
    wrong = []

    def work(kernel, n):
        for _ in range(20):
            out = np.full(n, -1, np.int64)
            try:
                L.launch(kernel, (2, n // 2), 0, out)
            except Exception as e:  # e.g. run in the other launch's context, as a device function
                wrong.append(repr(e))
                continue
            if not np.array_equal(out, np.arange(n)):
                wrong.append(f"{n} ids: {out}")

    try:
        threads = [threading.Thread(target=work, args=(k, n)) for k, n in ((_write_ids, 16), (_write_ids_too, 24))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert wrong == []


def test_a_blocks_threads_share_one_shared_array_when_switching_often():
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # ~1 launch in 50 met the simulator's race without the lock
    wrong = []
    try:
        for _ in range(300):
            out = np.full(16, -1, np.int64)
            L.launch(_write_ids, (2, 8), 0, out)
            if not np.array_equal(out, np.arange(16)):
                wrong.append(out)
    finally:
        sys.setswitchinterval(before)
    assert wrong == []
