"""``Placement``: which GPU each HBM-PS part lives on (Algorithm 2 of ``shared/seeds/004``: one node's
parameters split over its GPUs), and the device-to-device copies between them.

Part ``p`` lives on GPU ``p % gpus``; GPU 0 (the *main* device) also holds the dense model and a
mini-batch's plan. ``use(p)`` selects part ``p``'s GPU for the block (Numba's context and CuPy's
current device both), so kernels launched and arrays allocated inside it are on that GPU.
``peer(a, src, dst)`` copies a device array between GPUs (``cudaMemcpyPeer`` under CuPy; the same
object when ``src == dst``), counted as ``peer_bytes`` by the copy's :class:`TransferLedger`.

Under Numba's CUDA simulator there is one simulated GPU, and ``gpus`` may be any count: every
"GPU" is that one, ``use`` is a no-op, and ``peer`` between two distinct ids is a NumPy copy, counted
like the real one would be. This is how CI runs the multi-GPU path (``--gpus 2`` on the simulator).
"""

from __future__ import annotations

import contextlib

from .._checks import positive_int
from .._xp import simulated
from ..errors import InvalidInputError

__all__ = ["Placement", "visible_gpus"]


def visible_gpus() -> int:
    """GPUs this process can use (1 under the simulator, 0 without numba-cuda or a driver)."""
    try:
        from numba import cuda

        return len(cuda.gpus) if cuda.is_available() else 0
    except Exception:  # numba-cuda missing or broken
        return 0


class Placement:
    """The GPU of each of ``n_parts`` parts: part p on GPU ``p % gpus``.

    Args:
        n_parts: HBM-PS parts (>= 1).
        gpus: GPUs to spread them over; None = every visible GPU (``visible_gpus()``, at least 1).
            More than are visible is an :class:`InvalidInputError`, except under the simulator.
    """

    def __init__(self, n_parts: int, gpus: int | None = None):
        n_parts = positive_int(n_parts, "n_parts")
        visible = visible_gpus()
        gpus = positive_int(max(1, visible) if gpus is None else gpus, "gpus")
        self.simulated = simulated()
        if gpus > max(1, visible) and not self.simulated:
            raise InvalidInputError(f"--gpus {gpus}: only {visible} GPU(s) visible to this process "
                                    "(CUDA_VISIBLE_DEVICES); ask for at most that many")
        self.n_parts, self.gpus = int(n_parts), int(min(gpus, n_parts))

    def device(self, p: int) -> int:
        """The GPU id of part ``p``."""
        return p % self.gpus

    def use(self, p: int):
        """Context manager: part ``p``'s GPU is current in the block (no-op on the simulator)."""
        return self.use_device(self.device(p))

    @contextlib.contextmanager
    def use_device(self, g: int):
        """Context manager: GPU ``g`` is current in the block, for Numba and CuPy (no-op on the
        simulator)."""
        if self.simulated:
            yield
            return
        from numba import cuda

        with contextlib.ExitStack() as stack:
            stack.enter_context(cuda.gpus[g])
            try:
                import cupy
            except ImportError:  # a table without CuPy (the library use of PartitionedHashTable)
                pass
            else:
                stack.enter_context(cupy.cuda.Device(g))
            yield

    def peer(self, a, src: int, dst: int, ledger=None):
        """Device array ``a`` (of the array module, on GPU ``src``) on GPU ``dst``: ``a`` itself when
        ``src == dst``, else a copy (counted by ``ledger`` as ``peer_bytes`` when given).

        Ordered on the current streams of both devices (the legacy default stream, where hps's kernels
        run): streams of two GPUs never wait for each other by themselves, so the copy (on ``dst``'s
        stream) first waits for an event recorded on ``src``'s stream after the work that wrote ``a``,
        and ``src``'s stream then waits for the copy, so memory of ``a`` freed afterwards is not reused
        on ``src`` while the copy still reads it. Asynchronous."""
        if src == dst:
            return a
        if ledger is not None:
            ledger.peer(a.nbytes)
        if self.simulated:
            return a.copy()
        import cupy

        with self.use_device(src):
            written = cupy.cuda.Event(disable_timing=True)
            written.record()
        with self.use_device(dst):
            cupy.cuda.get_current_stream().wait_event(written)
            out = a.copy()  # CuPy copies an array of another device onto the current one
            copied = cupy.cuda.Event(disable_timing=True)
            copied.record()
        with self.use_device(src):
            cupy.cuda.get_current_stream().wait_event(copied)
        return out
