"""The layers the models are built from, each with an explicit forward and backward.

One code path for NumPy and CuPy: every function takes the array module ``xp`` (or works on the module
of its inputs) and uses only operations both offer. Parameter-free layers are pairs of functions;
layers with parameters (:class:`MLP`, :class:`Linear`, :class:`CrossNet`) hold the NAMES of their
parameters in the model's ``params`` dict and read them from the dict they are handed, so the dense
optimizer, checkpoints and exports see one flat ``{name: array}`` dict.

Conventions: ``n`` examples; a forward returns ``(output, ctx)`` and the matching backward takes that
``ctx`` and the gradient of the loss w.r.t. the output, and returns the gradient w.r.t. the input(s),
adding parameter gradients into a ``grads`` dict by name. Arrays are float (the model's dtype).
"""

from __future__ import annotations

import numpy as np

from . import _kernels

__all__ = ["init_weight", "Linear", "MLP", "CrossNet", "relu", "relu_backward", "fm", "fm_backward",
           "DotInteraction", "pool", "pool_backward", "scatter_add_for"]


def init_weight(rng, fan_in: int, fan_out: int, relu_follows: bool) -> np.ndarray:
    """(fan_in, fan_out) float64 weight drawn from ``rng``: He-uniform ``U(±sqrt(6 / fan_in))`` when
    a ReLU follows the layer, Xavier-uniform ``U(±sqrt(6 / (fan_in + fan_out)))`` otherwise."""
    bound = np.sqrt(6.0 / fan_in) if relu_follows else np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-bound, bound, size=(fan_in, fan_out))


# -- ReLU --------------------------------------------------------------------------------------
def relu(xp, x):
    """``max(x, 0)``; the output is the backward's ctx."""
    return xp.maximum(x, 0)


def relu_backward(y, dy):
    """Gradient through a ReLU whose OUTPUT was ``y``: ``dy * (y > 0)``."""
    return dy * (y > 0)


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

    def forward(self, p, x):
        """x (n, fan_in) -> (n, fan_out); ctx is x."""
        return x @ p[self.w] + p[self.b], x

    def backward(self, p, x, dy, grads, dx_cols: int | None = None):
        """Adds the W and b gradients into ``grads``; returns d x (n, fan_in), or only its first
        ``dx_cols`` columns (0: none, returns None)."""
        grads[self.w] = x.T @ dy
        grads[self.b] = dy.sum(axis=0)
        if dx_cols == 0:
            return None
        W = p[self.w] if dx_cols is None else p[self.w][:dx_cols]
        return dy @ W.T


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

    def forward(self, xp, p, x):
        """x (n, in) -> (n, out); ctx: the input of every layer, then the output."""
        acts, h = [], x
        for layer in self.layers:
            acts.append(h)
            h, _ = layer.forward(p, h)
            if layer.relu_follows:
                h = relu(xp, h)
        acts.append(h)
        return h, acts

    def backward(self, p, acts, dy, grads, dx_cols: int | None = None):
        """d input (n, in) (first ``dx_cols`` columns; 0: None) from d output ``dy`` (n, out)."""
        if not self.layers:
            return dy if dx_cols is None else (dy[:, :dx_cols] if dx_cols else None)
        if self.relu_last:
            dy = relu_backward(acts[-1], dy)
        for i in reversed(range(len(self.layers))):
            if i > 0:
                dy = relu_backward(acts[i], self.layers[i].backward(p, acts[i], dy, grads))
            else:
                dy = self.layers[0].backward(p, acts[0], dy, grads, dx_cols)
        return dy


# -- DCN-v2 cross network ----------------------------------------------------------------------
class CrossNet:
    """``n_layers`` DCN-v2 cross layers, full rank: ``x_{l+1} = x_0 * (x_l @ W_l + b_l) + x_l``.

    Parameters ``cross{l}_W`` (dim, dim) (Xavier-uniform) and ``cross{l}_b`` (dim,) (zeros).
    """

    def __init__(self, dim: int, n_layers: int):
        self.layers = [Linear(f"cross{l}_W", f"cross{l}_b", dim, dim) for l in range(int(n_layers))]

    def shapes(self) -> dict:
        return {k: v for layer in self.layers for k, v in layer.shapes().items()}

    def init(self, rng) -> dict:
        return {k: v for layer in self.layers for k, v in layer.init(rng).items()}

    def forward(self, p, x0):
        """x0 (n, dim) -> x_L (n, dim); ctx: ``(x0, [(x_l, x_l @ W_l + b_l) per layer])``."""
        x, ctx = x0, []
        for layer in self.layers:
            u, _ = layer.forward(p, x)
            ctx.append((x, u))
            x = x0 * u + x
        return x, (x0, ctx)

    def backward(self, p, ctx, dy, grads):
        """d x0 (n, dim) from d x_L ``dy`` (both paths into x0: the first layer's input and every
        layer's product)."""
        x0, layers = ctx
        dx0 = 0
        for layer, (x, u) in zip(reversed(self.layers), reversed(layers)):
            dx0 = dx0 + dy * u
            dy = layer.backward(p, x, dy * x0, grads) + dy
        return dx0 + dy


# -- factorisation machine ---------------------------------------------------------------------
def fm(xp, e):
    """Second-order FM term over field vectors ``e`` (n, F, d) -> (n,):
    ``sum_{f < g} <e_f, e_g> = 0.5 * sum_d [(sum_f e_f)^2 - sum_f e_f^2]`` (O(F d)); ctx is ``sum_f e_f``."""
    s = e.sum(axis=1)
    return 0.5 * ((s * s).sum(axis=1) - (e * e).sum(axis=(1, 2))), s


def fm_backward(e, s, dy):
    """d e (n, F, d) from d out ``dy`` (n,): ``dy * (sum_g e_g - e_f)``."""
    return dy[:, None, None] * (s[:, None, :] - e)


# -- DLRM dot interaction ----------------------------------------------------------------------
class DotInteraction:
    """Pairwise dot products of ``m`` vectors per example, lower triangle without the diagonal, in
    the order of ``numpy.tril_indices(m, -1)`` (DLRM's order): (n, m, d) -> (n, m (m - 1) / 2)."""

    def __init__(self, m: int):
        self.m = int(m)
        self._index = {}  # array module -> (li, lj) on it

    def _pairs(self, xp):
        if xp not in self._index:
            self._index[xp] = tuple(xp.asarray(i) for i in np.tril_indices(self.m, -1))
        return self._index[xp]

    @property
    def out_dim(self) -> int:
        return self.m * (self.m - 1) // 2

    def shapes(self) -> dict:  # no parameters
        return {}

    def init(self, rng) -> dict:
        return {}

    def forward(self, xp, t):
        """t (n, m, d) -> (n, out_dim); ctx is t."""
        li, lj = self._pairs(xp)
        return xp.matmul(t, t.transpose(0, 2, 1))[:, li, lj], t

    def backward(self, xp, t, dy):
        """d t (n, m, d) from d out ``dy`` (n, out_dim): ``(G + G^T) t`` with G the scattered ``dy``."""
        li, lj = self._pairs(xp)
        g = xp.zeros((t.shape[0], self.m, self.m), dtype=t.dtype)
        g[:, li, lj] = dy
        return xp.matmul(g + g.transpose(0, 2, 1), t)


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


def pool(xp, rows, inv, f, w, off, n: int, n_fields: int, use_kernels: bool):
    """Weighted sum-pooling per (example, field): rows (u, P) -> (n, F * P), C-contiguous.

    ``out[e, f*P:(f+1)*P] = sum over occurrences k of example e in field f of w[k] * rows[inv[k]]``;
    inv/f/w (nnz,) and off (n + 1,) as in :class:`hps.data.Batch`. ``use_kernels``: the Numba
    kernels (host NumPy arrays), else a gather + scatter-add (CuPy, or NumPy in tests).
    """
    P = rows.shape[1]
    out = xp.zeros((n, n_fields * P), dtype=rows.dtype)
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
