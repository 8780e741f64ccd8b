"""A model's pooled pass on a GPU replayed as CUDA graphs: two launches a mini-batch instead of ~30
(``HPS_CUDA_GRAPHS=1``, with the products through hps's cuBLAS handle: ``HPS_CUDA_GEMM=cublas-gil``).

Why: on an H200 (``bench/results/gpu-h200-2026-11-28``) the train stage of the issue's job spent ~4.5 ms a
mini-batch at both 4,096 and 16,384 examples: the cost is per operation, not per example. Every CuPy
operation and cuBLAS product of the network's forward and backward is a Python dispatch that hands the GIL
back during its driver call, and the prepare and place threads, running Python beside the train thread,
keep it for up to a switch interval each time (``hps._driver_launch``'s docstring). A graph replays the
pass's kernels with one ``cudaGraphLaunch``. CuPy's own ``matmul`` cannot be captured (CuPy 14.2 refuses
cuBLAS calls during a capture, cupy/cupy#6290: the first version of this module, dad4f14, failed so on the
H200 and was reverted); hps's products (``hps._cublas``: a handle with a work space of its own) can, so
graphs are made only in a cuBLAS product mode. Opt-in until a GPU has measured them.

What is captured, per shape of the pass's inputs (mini-batch size, dense width), the second time that shape
comes (the first runs eagerly, which compiles CuPy's kernels and sizes cuBLAS's work space): the network's
forward from a fixed input buffer to the logits, and its backward from a fixed ``dz`` buffer to the
gradient of the pooled input and the dense gradients (one flat buffer, ``_flat``). Between the two the
caller's ``loss_grad`` runs eagerly (it reads this mini-batch's labels and adds to the batch's loss
accumulator). A replay copies the inputs into the fixed buffers, launches the forward graph, copies
``loss_grad``'s result into ``dz`` and launches the backward graph, all on the current stream; it returns
the graph's own output arrays (the same ones every call of that shape: the caller consumes them in stream
order before the next call, as the train step does).

What keeps it right:

- Kernel arguments are frozen at capture: every array a graph touches has a fixed address for the
  graph's life. The dense parameters are views of one buffer updated in place (the optimizers step them
  in place, checkpoints load in place: ``FieldModel.load_state_dict``); activations live in a
  :class:`~hps.model._layers.Scratch` of the graph's own; every other array the capture allocates comes
  from a CuPy memory pool of the graph's own, which nothing else allocates from, so no block of a graph is
  ever handed to another array.
- The same kernels with the same arguments in the same order: a replay's results are bit for bit the eager
  pass's (``tests/gpu/test_pass_graphs_gpu.py``).
- A capture that fails (a CuPy without graphs, an operation the driver refuses to capture, products that
  went back to CuPy's after a failed probe) warns once and the model runs eagerly from then on.
- At most :data:`MAX_SHAPES` shapes are captured (a job has one or two: the full mini-batch and an
  epoch's last); others run eagerly.

Not thread-safe: the model's one training thread calls it.
"""

from __future__ import annotations

import warnings

from .. import _cublas
from .._env_mode import EnvMode
from . import _layers as L

__all__ = ["PassGraphs", "MAX_SHAPES"]

#: Shapes captured per model; a shape past them runs eagerly.
MAX_SHAPES = 4
#: ``HPS_CUDA_GRAPHS``: 1 captures the pass as graphs (read at each model's start)
_GRAPHS = EnvMode("HPS_CUDA_GRAPHS", ("0", "1"), "0", "CUDA graphs")


class PassGraphs:
    """The CUDA graphs of one model's :meth:`~hps.model.FieldModel.forward_backward_pooled`, by shape."""

    def __init__(self, model):
        self.model = model
        self.graphs: dict = {}
        self.seen: set = set()
        self.off = False
        self.replays = 0

    @classmethod
    def for_model(cls, model):
        """A :class:`PassGraphs` for a model on CuPy with stream capture when ``HPS_CUDA_GRAPHS=1`` and the
        products go through cuBLAS (``HPS_CUDA_GEMM``); else None (the model runs eagerly; a request for
        graphs with CuPy's products warns that it cannot be met)."""
        xp = model.xp
        want = _GRAPHS.read()
        if getattr(xp, "__name__", "") != "cupy" or want == "0":
            return None
        if _cublas.mode() == "cupy":
            warnings.warn("hps: HPS_CUDA_GRAPHS=1 needs the products through hps's cuBLAS handle "
                          "(HPS_CUDA_GEMM=cublas-gil or cublas: CuPy's matmul cannot be captured); training "
                          "without graphs", RuntimeWarning, stacklevel=3)
            return None
        if not hasattr(xp.cuda.Stream, "begin_capture"):
            return None
        return cls(model)

    def run(self, pooled, dense, loss_grad):
        """``forward_backward_pooled``'s result through this shape's graphs, or None where the caller
        runs the pass eagerly (graphs off, a shape's first call, a shape past :data:`MAX_SHAPES`)."""
        if self.off:
            return None
        key = (tuple(pooled.shape), None if dense is None else tuple(dense.shape))
        g = self.graphs.get(key)
        if g is None:
            if key not in self.seen or len(self.graphs) >= MAX_SHAPES:
                self.seen.add(key)
                return None
            if _cublas.mode() == "cupy":
                return self._give_up("the products went back to CuPy's matmul, which cannot be captured")
            try:
                g = self.graphs[key] = _Graphs(self.model, pooled, dense)
            except Exception as e:  # noqa: BLE001 - any refusal of the driver or CuPy: eager from now on
                return self._give_up(f"{type(e).__name__}: {e}")
        self.replays += 1
        return g.replay(pooled, dense, loss_grad)

    def stats(self) -> dict:
        """``{"shapes": captured, "replays": passes replayed, "off": whether a capture failed}``."""
        return {"shapes": len(self.graphs), "replays": self.replays, "off": self.off}

    def _give_up(self, why: str) -> None:
        """Turn graphs off for good, warning once why; None (the caller runs the pass eagerly)."""
        self.off = True
        warnings.warn(f"hps: capturing the network's pass as a CUDA graph failed ({why}); training goes on "
                      "without graphs (HPS_CUDA_GRAPHS=0 skips the attempt)", RuntimeWarning, stacklevel=4)
        return None


class _Graphs:
    """The forward and backward graphs of one shape, and every array they read or write."""

    def __init__(self, model, pooled, dense):
        cp = model.xp
        self.pooled = cp.empty_like(pooled)
        self.dense = None if dense is None else cp.empty_like(dense)
        self.dz = cp.empty((pooled.shape[0], 1), dtype=model.dtype)
        self.scratch = [L.Scratch(cp)]
        self.pool = cp.cuda.MemoryPool()
        stream = cp.cuda.Stream(non_blocking=True)
        with cp.cuda.using_allocator(self.pool.malloc), stream:
            stream.begin_capture()
            try:
                self.z, ctxs = model._pooled_forward(self.pooled, self.dense, self.scratch)
            finally:
                self.forward = stream.end_capture()
            stream.begin_capture()
            try:
                self.d_pooled, self.grads = model._pooled_backward(ctxs, self.dz, self.scratch)
            finally:
                self.backward = stream.end_capture()
        self.ctxs = ctxs  # the activations the backward graph reads

    def replay(self, pooled, dense, loss_grad):
        self.pooled[...] = pooled
        if dense is not None:
            self.dense[...] = dense
        self.forward.launch()
        self.dz[:, 0] = loss_grad(self.z)
        self.backward.launch()
        return self.d_pooled, self.grads
