"""Dense optimizers: update the model's named dense tensors in place and keep their state (per
tensor, same shape) for checkpoints via ``state_dict()``. Formulas follow ``torch.optim`` (Adagrad with
lr_decay = weight_decay = 0, Adam without amsgrad and weight decay) so a PyTorch peer started from the
same values takes the same steps. Arrays may be NumPy or CuPy. Not thread-safe.

A step makes no temporary array. When the parameters and the gradients are each views of one flat
buffer in the same order (``_flat``: the models' are), the optimizer keeps its state that way too and
steps the three buffers at once: one kernel call (or one set of CuPy operations) for all tensors, the
same bits. Adam and Adagrad step a C-contiguous host tensor (or buffer) in one pass of a Numba CPU
kernel (``_dense_kernels``: one rounding per operation, the bits of the plain NumPy expressions). On a
GPU each elementwise operation of the formula (13 for Adam) is a CuPy operation writing into one of
two work buffers per tensor or buffer (kept between steps, not checkpointed) or into the state,
in the order written out in the docstrings, as SGD and any tensor that is not C-contiguous are everywhere;
with ``HPS_DENSE_STEP=kernel`` a tensor's whole step is one CUDA launch instead (``_dense_kernels_cuda``:
the host kernels' element function; the GPU compiler may fuse a multiply and an add, so equal to
rounding). CuPy's operations are the default because an H200 measured them faster while a Numba launch
cost ~0.5 ms (bench/results/gpu-h200-2026-11-27-night); ``hps._driver_launch`` launches for less now,
unmeasured on a GPU (``bench/device_check.sh`` step ``modes`` runs the job both ways).
"""

from __future__ import annotations

import math

import numpy as np

from .._env_mode import EnvMode
from ..errors import InvalidInputError
from . import _dense_kernels as K
from ._flat import flat_of, flat_views
from ._row_optim import _check_lr, _xp_of

__all__ = ["DenseSGD", "DenseAdagrad", "DenseAdam"]


def _flat(*arrays) -> bool:
    """Whether the arrays (host or device) can be stepped through flat views (C-contiguous, of one float
    dtype)."""
    return all(a.flags.c_contiguous and a.dtype == arrays[0].dtype for a in arrays) and arrays[0].dtype.kind == "f"


#: ``HPS_DENSE_STEP``'s values: how a device tensor's Adam or Adagrad step runs.
DENSE_STEPS = ("ops", "kernel")
_DENSE_STEP = EnvMode("HPS_DENSE_STEP", DENSE_STEPS, "ops", "dense step")


def device_step() -> str:
    """``HPS_DENSE_STEP`` now: ``ops`` (CuPy's elementwise operations, the default) or ``kernel`` (one CUDA
    launch a tensor)."""
    return _DENSE_STEP.read()


def launch_dense(kernel: str, p, arrays, scalars, stream=None) -> bool:
    """Enqueue ``_dense_kernels_cuda.<kernel>(p, *arrays, *scalars)`` over the n elements of the flat
    device arrays, on ``stream`` (None: CuPy's current one, where the gradients were made) -> True;
    False when numba-cuda cannot be imported. Asynchronous. Under the CUDA simulator NumPy arrays stand
    for device arrays (``hps._launch``)."""
    from .. import _launch as L

    try:
        from . import _dense_kernels_cuda as KC
    except Exception:  # numba-cuda missing or broken: the caller steps with CuPy's operations instead
        return False
    if stream is None:
        xp = _xp_of(p)
        stream = xp.cuda.get_current_stream() if xp is not np else 0
    args = [L.arg(a, "dense tensor", p.dtype, 1) for a in (p, *arrays)]
    if p.shape[0]:
        L.launch(getattr(KC, kernel), L.grid1(p.shape[0]), stream, *args, *scalars)
    return True


class _DenseOptimizer:
    """Base of dense optimizers: ``step(params, grads)`` updates the arrays of ``params`` in place."""

    name = ""
    _slots: tuple[str, ...] = ()
    _slot_init = 0.0  # every state slot of a tensor starts at this value

    def __init__(self):
        self.t = 0
        self._state: dict[str, dict] = {s: {} for s in self._slots}
        self._work: dict = {}  # param name (None: the flat buffer) -> (two arrays like it): a step's values
        self._tiled = None     # (parameters' buffer, {slot: its state's Tiled}): _step_tiled

    def step(self, params: dict, grads: dict) -> None:
        """One step. params/grads: dicts name -> array (same names, shapes); params updated in place."""
        if set(grads) != set(params):
            raise InvalidInputError(f"grad names {sorted(grads)} != param names {sorted(params)}")
        self.t += 1
        if self._step_tiled(params, grads):
            return
        for k, p in params.items():
            g = grads[k]
            if g.shape != p.shape:
                raise InvalidInputError(f"{k}: grad shape {tuple(g.shape)} != param {tuple(p.shape)}")
            xp = _xp_of(p)
            st = {}
            for s in self._slots:
                a = self._state[s].get(k)
                if a is None:
                    a = xp.full_like(p, self._slot_init)
                elif _xp_of(a) is not xp or a.dtype != p.dtype:  # loaded from a host checkpoint
                    a = xp.asarray(a, dtype=p.dtype)
                self._state[s][k] = st[s] = a
            g = g.astype(p.dtype, copy=False)
            if _flat(p, g, *st.values()):
                fused = self._fused_for(xp)
                if fused is not None and fused(p.reshape(-1), g.reshape(-1), {s: a.reshape(-1) for s, a in st.items()}):
                    continue
            self._update(p, g, st, xp, self._buffers(k, p, xp))

    def _step_tiled(self, params: dict, grads: dict) -> bool:
        """The step of every tensor at once when ``params`` and ``grads`` are intact :class:`~._flat.Tiled`
        dicts of one layout (``_flat``), the state kept as views of buffers laid out alike (made on the
        first such step) -> True; False (nothing done) otherwise."""
        pb, gb = flat_of(params), flat_of(grads)
        if (pb is None or gb is None or params.layout != grads.layout or pb.dtype.kind != "f"
                or gb.dtype != pb.dtype or _xp_of(gb) is not _xp_of(pb)):
            return False
        xp = _xp_of(pb)
        if self._tiled is None or self._tiled[0] is not pb or not self._state_intact():
            self._tiled = (pb, {s: self._tile_state(s, params, xp) for s in self._slots})
        st = {s: t.flat for s, t in self._tiled[1].items()}
        fused = self._fused_for(xp)
        if fused is None or not fused(pb, gb, st):
            self._update(pb, gb, st, xp, self._buffers(None, pb, xp))
        return True

    def _fused_for(self, xp):
        """The one-pass step of a flat tensor on ``xp``: the host kernel on NumPy, the one-launch step on a
        GPU with ``HPS_DENSE_STEP=kernel``, else None (the elementwise operations of :meth:`_update`)."""
        return self._fused if xp is np else (self._fused_device if device_step() == "kernel" else None)

    def _state_intact(self) -> bool:
        """Whether every slot's state still holds the views :meth:`_tile_state` made (a caller may have put
        other arrays in it, e.g. a checkpoint's: then it is laid out anew)."""
        return all(self._state[s].get(k) is v for s, t in self._tiled[1].items() for k, v in t.views)

    def _tile_state(self, slot: str, params, xp):
        """Slot ``slot``'s state of the tensors of ``params`` (a :class:`~._flat.Tiled`) as the views of a
        new buffer laid out alike (``flat_views``), their values kept (a checkpoint's, or those of earlier
        steps; a new one at the slot's start) -> that :class:`~._flat.Tiled`."""
        t = flat_views(xp, dict(params.layout), params.flat.dtype)
        for k, view in t.views:
            a = self._state[slot].get(k)
            if a is None:
                view.fill(self._slot_init)
            else:
                view[...] = xp.asarray(a, dtype=view.dtype)
        self._state[slot].update(t)
        return t

    def _buffers(self, name: str | None, p, xp):
        w = self._work.get(name)
        if w is None or w[0].shape != p.shape or w[0].dtype != p.dtype or _xp_of(w[0]) is not xp:
            w = self._work[name] = (xp.empty_like(p), xp.empty_like(p))
        return w

    def _update(self, p, g, st, xp, work):
        """One step of tensor ``p`` in place; ``work``: two arrays like ``p`` to compute in."""
        raise NotImplementedError

    def _fused(self, p, g, st) -> bool:
        """The step of :meth:`_update` on flat C-contiguous host arrays (``st``: the state, flat too) in
        one kernel pass (``_dense_kernels``: the same bits) -> True, or False where there is none."""
        return False

    def _fused_device(self, p, g, st) -> bool:
        """:meth:`_fused` on flat C-contiguous device arrays: one CUDA kernel launch
        (``_dense_kernels_cuda``: the same operations, to rounding) on the current CuPy stream -> True,
        or False where there is none."""
        return False

    def _hyper(self) -> dict:
        return {}

    def state_dict(self) -> dict:
        """Host copies: ``{"name", "step", <hyperparameters>, <slot>: {param name: array}}``."""
        d = {"name": self.name, "step": self.t, **self._hyper()}
        for s in self._slots:
            d[s] = {k: (a.get() if hasattr(a, "get") else np.array(a)) for k, a in self._state[s].items()}
        return d

    def load_state_dict(self, state: dict, hyperparameters: bool = True) -> None:
        """Restore a :meth:`state_dict` (of the same optimizer kind); its hyperparameters too, unless
        ``hyperparameters`` is False (this optimizer's own stay: a resumed job's options)."""
        if state.get("name") != self.name:
            raise InvalidInputError(f"state of optimizer {state.get('name')!r} loaded into {self.name!r}")
        self.t = int(state["step"])
        for k in self._hyper():
            if hyperparameters and k in state:
                setattr(self, k, tuple(float(b) for b in state[k]) if k == "betas" else float(state[k]))
        self._state = {s: {k: np.array(a) for k, a in state.get(s, {}).items()} for s in self._slots}
        self._tiled = None


class DenseSGD(_DenseOptimizer):
    """``p -= lr * g``."""

    name = "sgd"

    def __init__(self, lr: float):
        super().__init__()
        self.lr = _check_lr(lr)

    def _hyper(self):
        return {"lr": self.lr}

    def _update(self, p, g, st, xp, work):
        p -= xp.multiply(g, p.dtype.type(self.lr), out=work[0])


class DenseAdagrad(_DenseOptimizer):
    """``acc += g^2;  p -= lr * g / (sqrt(acc) + eps)``; ``acc`` starts at ``initial_accumulator``."""

    name = "adagrad"
    _slots = ("acc",)

    def __init__(self, lr: float, initial_accumulator: float = 0.0, eps: float = 1e-10):
        super().__init__()
        self.lr = _check_lr(lr)
        if not (initial_accumulator >= 0 and eps >= 0):
            raise InvalidInputError("initial_accumulator and eps must be >= 0")
        self.initial_accumulator, self.eps = float(initial_accumulator), float(eps)

    @property
    def _slot_init(self):
        return self.initial_accumulator

    def _hyper(self):
        return {"lr": self.lr, "initial_accumulator": self.initial_accumulator, "eps": self.eps}

    def _update(self, p, g, st, xp, work):
        t = p.dtype.type
        acc, a, b = st["acc"], work[0], work[1]
        acc += xp.multiply(g, g, out=a)
        den = xp.sqrt(acc, out=b)
        den += t(self.eps)
        step = xp.multiply(g, t(self.lr), out=a)          # lr * g
        step /= den
        p -= step

    def _fused(self, p, g, st) -> bool:
        K.adagrad_flat(p, g, st["acc"], self.lr, self.eps)
        return True

    def _fused_device(self, p, g, st) -> bool:
        t = p.dtype.type
        return launch_dense("adagrad_dense", p, (g, st["acc"]), (t(self.lr), t(self.eps)))


class DenseAdam(_DenseOptimizer):
    """Adam as ``torch.optim.Adam`` (no amsgrad, no weight decay); step count ``t`` starts at 1::

        m = b1 m + (1 - b1) g;   v = b2 v + (1 - b2) g^2
        p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    """

    name = "adam"
    _slots = ("m", "v")

    def __init__(self, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        super().__init__()
        self.lr = _check_lr(lr)
        b1, b2 = (float(b) for b in betas)
        if not (0 <= b1 < 1 and 0 <= b2 < 1 and eps >= 0):
            raise InvalidInputError(f"need betas in [0, 1) and eps >= 0, got {betas}, {eps}")
        self.betas, self.eps = (b1, b2), float(eps)

    def _hyper(self):
        return {"lr": self.lr, "betas": self.betas, "eps": self.eps}

    def _corrections(self) -> tuple[float, float]:
        """(lr / (1 - b1^t), sqrt(1 - b2^t)) of step ``t``: what both step paths divide by."""
        b1, b2 = self.betas
        return self.lr / (1 - b1 ** self.t), math.sqrt(1 - b2 ** self.t)

    def _update(self, p, g, st, xp, work):
        b1, b2 = self.betas
        t = p.dtype.type
        m, v, a, b = st["m"], st["v"], work[0], work[1]
        m *= t(b1)
        m += xp.multiply(g, t(1 - b1), out=a)             # (1 - b1) g
        v *= t(b2)
        sq = xp.multiply(g, g, out=a)
        sq *= t(1 - b2)                                   # (1 - b2) (g g)
        v += sq
        step_size, bc2_sqrt = self._corrections()
        den = xp.sqrt(v, out=b)
        den /= t(bc2_sqrt)
        den += t(self.eps)
        step = xp.multiply(m, t(step_size), out=a)        # step_size m
        step /= den
        p -= step

    def _fused(self, p, g, st) -> bool:
        b1, b2 = self.betas
        K.adam_flat(p, g, st["m"], st["v"], b1, 1 - b1, b2, 1 - b2, *self._corrections(), self.eps)
        return True

    def _fused_device(self, p, g, st) -> bool:
        b1, b2 = self.betas
        t = p.dtype.type
        step_size, bc2_sqrt = self._corrections()
        return launch_dense("adam_dense", p, (g, st["m"], st["v"]),
                            (t(b1), t(1 - b1), t(b2), t(1 - b2), t(step_size), t(bc2_sqrt), t(self.eps)))
