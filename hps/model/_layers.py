"""The layers the models are built from, each with an explicit forward and backward.

One code path for NumPy and CuPy: every function takes the array module ``xp`` (or works on the module
of its inputs) and uses only operations both offer. Parameter-free layers are pairs of functions;
layers with parameters (:class:`MLP`, :class:`Linear`, :class:`CrossNet`) hold the NAMES of their
parameters in the model's ``params`` dict and read them from the dict they are handed, so the dense
optimizer, checkpoints and exports see one flat ``{name: array}`` dict.

Conventions: ``n`` examples; a forward returns ``(output, ctx)`` and the matching backward takes that
``ctx`` and the gradient of the loss w.r.t. the output, and returns the gradient w.r.t. the input(s),
adding parameter gradients into a ``grads`` dict by name. Arrays are float (the model's dtype); no
step promotes them (scalars are Python numbers or of the arrays' dtype).

No avoidable work: products are written into their output (``matmul(out=)``), the bias and ReLU are
applied in place on it, the backward masks its own gradient in place, and with a :class:`Scratch`
(``ws``) every activation and input gradient goes into a buffer reused from one mini-batch to the
next. A backward never changes its ``ctx`` or the gradient it is handed.
"""

from __future__ import annotations

import numpy as np

from .. import _cublas
from .._env_mode import EnvMode
from . import _kernels
from ._row_optim import _xp_of

__all__ = ["init_weight", "Scratch", "buffer", "Linear", "MLP", "CrossNet", "relu_backward", "fm", "fm_backward",
           "fm_backward_add", "DotInteraction", "pool", "pool_backward", "scatter_add_for"]


def init_weight(rng, fan_in: int, fan_out: int, relu_follows: bool) -> np.ndarray:
    """(fan_in, fan_out) float64 weight drawn from ``rng``: He-uniform ``U(±sqrt(6 / fan_in))`` when
    a ReLU follows the layer, Xavier-uniform ``U(±sqrt(6 / (fan_in + fan_out)))`` otherwise."""
    bound = np.sqrt(6.0 / fan_in) if relu_follows else np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=(fan_in, fan_out))


# -- scratch buffers --------------------------------------------------------------------------
class Scratch:
    """Arrays a pass reuses from one mini-batch to the next instead of allocating them again:
    ``get(name, shape, dtype)`` returns the leading ``shape[0]`` rows of the buffer ``name``, which is
    (re)allocated only when it is missing, of another dtype or trailing shape, or has fewer rows (so
    a shorter last chunk reuses it, and one buffer per name bounds the memory).

    Layers name their buffers after their parameters (``"W0.y"``), so no two live arrays of one pass
    share a buffer. An array got from it is valid until the next call that gets the same name: a pass
    keeps its activations here from its forward to its backward, and a caller copies whatever it
    returns. Arrays are uninitialised unless ``zero`` (zeroed once, when first allocated). One Scratch
    per concurrently running chunk: not thread-safe. ``ws=None`` everywhere below allocates afresh.
    """

    def __init__(self, xp):
        self.xp = xp
        self._bufs: dict = {}

    def get(self, name: str, shape, dtype, zero: bool = False):
        shape, dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        a = self._bufs.get(name)
        if a is None or a.dtype != dtype or a.shape[1:] != shape[1:] or a.shape[0] < shape[0]:
            a = self._bufs[name] = (self.xp.zeros if zero else self.xp.empty)(shape, dtype=dtype)
        return a[:shape[0]]


def buffer(xp, ws, name: str, shape, dtype):
    """A new uninitialised array, or with ``ws`` its buffer ``name`` (:meth:`Scratch.get`)."""
    return xp.empty(shape, dtype=dtype) if ws is None else ws.get(name, shape, dtype)


def matmul_into(xp, a, b, out):
    """``a @ b`` of 2-D arrays written into ``out`` -> ``out``; on the GPU through ``hps._cublas`` (CuPy's
    ``matmul`` unless ``HPS_CUDA_GEMM`` picks cuBLAS called with the GIL held)."""
    if isinstance(out, np.ndarray):
        return xp.matmul(a, b, out=out)
    return _cublas.matmul(a, b, out)


def _matmul(ws, name, a, b):
    """``a @ b``, into the buffer ``name`` of ``ws`` when given."""
    if ws is None:
        return a @ b
    return matmul_into(ws.xp, a, b, ws.get(name, (a.shape[0], b.shape[1]), a.dtype))


#: ``HPS_CUDA_LAYERS``: how a CuPy pass applies a layer's bias and ReLU and masks the ReLU's gradient:
#: ``ops`` (CuPy's operations, two each) or ``kernel`` (one hps launch each, the GIL held through it:
#: ``_layer_kernels_cuda``; the same bits).
LAYER_STEP = EnvMode("HPS_CUDA_LAYERS", ("ops", "kernel"), "ops", "layer step")


def _launch_layer(kernel: str, *args) -> None:
    """Enqueue ``_layer_kernels_cuda.<kernel>(*args)`` over the elements of its (n, m) arrays, on CuPy's
    current stream (NumPy arrays under the CUDA simulator: ``hps._launch``, stream 0)."""
    from .. import _launch as L
    from . import _layer_kernels_cuda as KC

    a = args[0]
    xp = _xp_of(a)
    stream = xp.cuda.get_current_stream() if xp is not np else 0
    dev = [x if np.isscalar(x) else L.arg(x, f"{kernel} array", a.dtype, x.ndim) for x in args]
    if a.size:
        L.launch(getattr(KC, kernel), L.grid1(a.size), stream, *dev)


def _kernels_on(x) -> bool:
    return not isinstance(x, np.ndarray) and LAYER_STEP.get() == "kernel"


# -- ReLU --------------------------------------------------------------------------------------
def relu_backward(y, dy):
    """Gradient through a ReLU whose OUTPUT was ``y``: ``dy * (y > 0)``."""
    return dy * (y > 0)


def _relu_backward_(y, dy):
    """:func:`relu_backward` in place into ``dy`` (an array the pass owns); returns it."""
    if _kernels_on(dy) and dy.flags.c_contiguous and y.flags.c_contiguous:
        _launch_layer("relu_mask", y, dy)
    else:
        dy *= y > 0
    return dy


# -- Linear and MLP ----------------------------------------------------------------------------
class Linear:
    """``y = x @ W + b``: W ``(fan_in, fan_out)`` and b ``(fan_out,)`` are ``params[w]``, ``params[b]``;
    ``relu_follows`` picks the initialisation (see :func:`init_weight`)."""

    def __init__(self, w: str, b: str, fan_in: int, fan_out: int, relu_follows: bool = False):
        self.w, self.b, self.fan_in, self.fan_out = w, b, int(fan_in), int(fan_out)
        self.relu_follows = relu_follows

    def shapes(self) -> dict:
        return {self.w: (self.fan_in, self.fan_out), self.b: (self.fan_out,)}

    def init(self, rng) -> dict:
        """``{w: float64 weight (see init_weight), b: zeros}`` drawn from ``rng``."""
        return {self.w: init_weight(rng, self.fan_in, self.fan_out, self.relu_follows),
                self.b: np.zeros(self.fan_out)}

    def forward(self, p, x, ws=None, relu: bool = False):
        """x (n, fan_in) -> (n, fan_out) (the bias added in place, then the ReLU when ``relu``; into ``ws``
        buffer ``"{w}.y"``); ctx is x."""
        y = _matmul(ws, self.w + ".y", x, p[self.w])
        if _kernels_on(y) and y.flags.c_contiguous:
            _launch_layer("bias_act", y, p[self.b], relu, y.dtype.type(0))
            return y, x
        y += p[self.b]
        if relu:
            _xp_of(y).maximum(y, 0, out=y)
        return y, x

    def backward(self, p, x, dy, grads, dx_cols: int | None = None, ws=None):
        """Adds the W and b gradients into ``grads``: written into the arrays it already holds under
        their names (a pass's flat gradient buffer, ``FieldModel._grad_targets``), else as new arrays,
        never ``ws`` buffers. Returns d x (n, fan_in), or only its first ``dx_cols`` columns (0: none,
        returns None), into ``ws`` buffer ``"{w}.dx"``."""
        gw, gb = grads.get(self.w), grads.get(self.b)
        if gw is None:
            grads[self.w] = x.T @ dy
        else:
            matmul_into(_xp_of(x), x.T, dy, gw)
        if gb is None:
            grads[self.b] = dy.sum(axis=0)
        elif isinstance(dy, np.ndarray):
            dy.sum(axis=0, out=gb)
        else:
            _cublas.column_sums(dy, gb)
        if dx_cols == 0:
            return None
        W = p[self.w] if dx_cols is None else p[self.w][:dx_cols]
        return _matmul(ws, self.w + ".dx", dy, W.T)


class MLP:
    """Linear layers with a ReLU after each but the last (``relu_last=True``: after the last too).

    Parameters ``{prefix}W{i}``, ``{prefix}b{i}``; ``widths = (in, h1, ..., out)``. An MLP with a
    single width (no layer) is the identity.
    """

    def __init__(self, widths, prefix: str = "", relu_last: bool = False):
        widths = [int(w) for w in widths]
        n = len(widths) - 1
        self.relu_last = relu_last
        self.layers = [Linear(f"{prefix}W{i}", f"{prefix}b{i}", widths[i], widths[i + 1],
                              relu_follows=i < n - 1 or relu_last) for i in range(n)]
        self.out_dim = widths[-1]

    def shapes(self) -> dict:
        return {k: v for layer in self.layers for k, v in layer.shapes().items()}

    def init(self, rng) -> dict:
        """Parameters drawn from ``rng`` in layer order (He for layers followed by a ReLU, else Xavier)."""
        return {k: v for layer in self.layers for k, v in layer.init(rng).items()}

    def forward(self, xp, p, x, ws=None):
        """x (n, in) -> (n, out); ctx: the input of every layer, then the output. Each layer's output
        is made in place: product, bias, ReLU."""
        acts, h = [], x
        for layer in self.layers:
            acts.append(h)
            h, _ = layer.forward(p, h, ws, relu=layer.relu_follows)
        acts.append(h)
        return h, acts

    def backward(self, p, acts, dy, grads, dx_cols: int | None = None, ws=None):
        """d input (n, in) (first ``dx_cols`` columns; 0: None) from d output ``dy`` (n, out).
        ``dy`` and ``acts`` are left as they are."""
        if not self.layers:
            return dy if dx_cols is None else (dy[:, :dx_cols] if dx_cols else None)
        if self.relu_last:
            dy = relu_backward(acts[-1], dy)
        for i in reversed(range(len(self.layers))):
            if i > 0:
                dy = _relu_backward_(acts[i], self.layers[i].backward(p, acts[i], dy, grads, ws=ws))
            else:
                dy = self.layers[0].backward(p, acts[0], dy, grads, dx_cols, ws=ws)
        return dy


# -- DCN-v2 cross network ----------------------------------------------------------------------
class CrossNet:
    """``n_layers`` DCN-v2 cross layers, full rank: ``x_{l+1} = x_0 * (x_l @ W_l + b_l) + x_l``, each
    one (n, dim) x (dim, dim) matrix product for the whole mini-batch (and two in the backward).

    Parameters ``cross{l}_W`` (dim, dim) (Xavier-uniform) and ``cross{l}_b`` (dim,) (zeros).
    """

    def __init__(self, dim: int, n_layers: int):
        self.layers = [Linear(f"cross{l}_W", f"cross{l}_b", dim, dim) for l in range(int(n_layers))]

    def shapes(self) -> dict:
        return {k: v for layer in self.layers for k, v in layer.shapes().items()}

    def init(self, rng) -> dict:
        return {k: v for layer in self.layers for k, v in layer.init(rng).items()}

    def forward(self, xp, p, x0, ws=None):
        """x0 (n, dim) -> x_L (n, dim); ctx: ``(x0, [(x_l, x_l @ W_l + b_l) per layer])``."""
        x, ctx = x0, []
        for layer in self.layers:
            u, _ = layer.forward(p, x, ws)
            ctx.append((x, u))
            nxt = buffer(xp, ws, layer.w + ".x", x0.shape, x0.dtype)
            xp.multiply(x0, u, out=nxt)
            nxt += x
            x = nxt
        return x, (x0, ctx)

    def backward(self, xp, p, ctx, dy, grads, ws=None):
        """d x0 (n, dim) from d x_L ``dy`` (both paths into x0: the first layer's input and every
        layer's product); ``dy`` is left as it is."""
        x0, layers = ctx
        shape, dtype = x0.shape, x0.dtype
        dx0 = buffer(xp, ws, "cross.dx0", shape, dtype)
        tmp = buffer(xp, ws, "cross.tmp", shape, dtype)
        for i, (layer, (x, u)) in enumerate(zip(reversed(self.layers), reversed(layers))):
            if i == 0:
                xp.multiply(dy, u, out=dx0)
            else:
                dx0 += xp.multiply(dy, u, out=tmp)
            d_u = xp.multiply(dy, x0, out=tmp)
            d_x = layer.backward(p, x, d_u, grads, ws=ws)
            d_x += dy
            dy = d_x
        dx0 += dy
        return dx0


# -- factorisation machine ---------------------------------------------------------------------
def fm(xp, e):
    """Second-order FM term over field vectors ``e`` (n, F, d) -> (n,):
    ``sum_{f < g} <e_f, e_g> = 0.5 * sum_d [(sum_f e_f)^2 - sum_f e_f^2]`` (O(F d)); ctx is ``sum_f e_f``."""
    s = e.sum(axis=1)
    return 0.5 * ((s * s).sum(axis=1) - (e * e).sum(axis=(1, 2))), s


def fm_backward(e, s, dy):
    """d e (n, F, d) from d out ``dy`` (n,): ``dy * (sum_g e_g - e_f)``."""
    return dy[:, None, None] * (s[:, None, :] - e)


def fm_backward_add(xp, e, s, dy, out):
    """``out += fm_backward(e, s, dy)`` in place, ``out`` (n, F, d) an array the pass owns."""
    t = xp.subtract(s[:, None, :], e)
    t *= dy[:, None, None]
    out += t
    return out


# -- DLRM dot interaction ----------------------------------------------------------------------
class DotInteraction:
    """Pairwise dot products of ``m`` vectors per example, lower triangle without the diagonal, in
    the order of ``numpy.tril_indices(m, -1)`` (DLRM's order): (n, m, d) -> (n, m (m - 1) / 2).

    Forward: the batched Gram matrix ``t t^T`` (one (m, d) x (d, m) product per example) and its lower
    triangle taken by flat index. Backward: ``d t = S t`` with ``S`` the symmetric (m, m) matrix of the
    output gradient (``dy`` on both triangles, 0 on the diagonal), again one batched product.
    """

    def __init__(self, m: int):
        self.m = int(m)
        self._index = {}  # array module -> (flat lower-triangle index, flat mirrored index) on it

    def _pairs(self, xp):
        if xp not in self._index:
            li, lj = np.tril_indices(self.m, -1)
            self._index[xp] = (xp.asarray(li * self.m + lj), xp.asarray(lj * self.m + li))
        return self._index[xp]

    @property
    def out_dim(self) -> int:
        return self.m * (self.m - 1) // 2

    def shapes(self) -> dict:  # no parameters
        return {}

    def init(self, rng) -> dict:
        return {}

    def forward(self, xp, t, ws=None):
        """t (n, m, d) -> (n, out_dim); ctx is t."""
        lower, _ = self._pairs(xp)
        n, m = t.shape[0], self.m
        gram = buffer(xp, ws, "inter.gram", (n, m, m), t.dtype)
        xp.matmul(t, t.transpose(0, 2, 1), out=gram)
        return xp.take(gram.reshape(n, m * m), lower, axis=1), t

    def backward(self, xp, t, dy, ws=None):
        """d t (n, m, d) from d out ``dy`` (n, out_dim): ``S t``, S symmetric with ``dy`` off the diagonal."""
        lower, upper = self._pairs(xp)
        n, m = t.shape[0], self.m
        # the diagonal is never written: zero from the buffer's first use on
        s = ws.get("inter.sym", (n, m, m), t.dtype, zero=True) if ws is not None else xp.zeros((n, m, m), t.dtype)
        flat = s.reshape(n, m * m)
        flat[:, lower] = dy
        flat[:, upper] = dy
        return xp.matmul(s, t, out=buffer(xp, ws, "inter.dt", t.shape, t.dtype))


# -- field pooling -----------------------------------------------------------------------------
def scatter_add_for(xp):
    """``scatter_add(out, idx, values)`` (out[idx] += values, duplicates summed) for module xp."""
    if xp is np:
        return np.add.at
    try:
        import cupy
        import cupyx
    except ImportError:  # pragma: no cover - any other xp must bring its own
        cupy = None
    if cupy is not None and xp is cupy:
        return cupyx.scatter_add
    from ..errors import InvalidInputError

    raise InvalidInputError(f"no scatter-add known for array module {xp!r}")


def _example_of(xp, offsets, nnz):
    """(nnz,) int64: the example of each key occurrence, from CSR ``offsets`` (n + 1,)."""
    return xp.searchsorted(offsets[1:], xp.arange(nnz, dtype=np.int64), side="right").astype(np.int64)


def pool(xp, rows, inv, f, w, off, n: int, n_fields: int, use_kernels: bool, out=None):
    """Weighted sum-pooling per (example, field): rows (u, P) -> (n, F * P), C-contiguous.

    ``out[e, f*P:(f+1)*P] = sum over occurrences k of example e in field f of w[k] * rows[inv[k]]``;
    inv/f/w (nnz,) and off (n + 1,) as in :class:`hps.data.Batch`. ``use_kernels``: the Numba
    kernels (host NumPy arrays), else a gather + scatter-add (CuPy, or NumPy in tests). ``out``: a
    C-contiguous (n, F * P) array to write into (zeroed here), else a new one.
    """
    P = rows.shape[1]
    if out is None:
        out = xp.zeros((n, n_fields * P), dtype=rows.dtype)
    else:
        out.fill(0)
    if use_kernels:
        _kernels.pool_fields(rows, inv, f, w, off, out)
    elif inv.shape[0]:
        slot = _example_of(xp, off, inv.shape[0]) * n_fields + f
        scatter_add_for(xp)(out.reshape(n * n_fields, P), slot, rows[inv] * w[:, None])
    return out


def pool_backward(xp, grad_pooled, u: int, inv, f, w, off, n_fields: int, use_kernels: bool):
    """Transpose of :func:`pool`: grad_pooled (n, F * P) -> (u, P), each unique row's gradient
    summed over its occurrences."""
    n = grad_pooled.shape[0]
    P = grad_pooled.shape[1] // n_fields if n_fields else 0
    out = xp.zeros((u, P), dtype=grad_pooled.dtype)
    if use_kernels:
        _kernels.pool_fields_backward(grad_pooled, inv, f, w, off, out)
    elif inv.shape[0]:
        slot = _example_of(xp, off, inv.shape[0]) * n_fields + f
        scatter_add_for(xp)(out, inv, grad_pooled.reshape(n * n_fields, P)[slot] * w[:, None])
    return out
