"""The models, each a composition of the layers of ``_layers.py`` on top of :class:`FieldModel`.

Notation: ``n`` examples, ``F`` fields, ``d`` emb_dim, ``e`` the per-field sum-pooled embeddings
(n, F, d), ``x0 = [e flattened | dense features]`` (n, F d + n_dense), ``MLP(h...)`` linear layers
with a ReLU between them.

- ``ctr``    ``logit = MLP(x0 -> hidden -> 1)``.
- ``wdl``    Wide & Deep: ``logit = MLP(x0 -> hidden -> 1) + sum of the first-order weights`` of the
             example's keys (weighted like the embeddings); the first-order weight lives in the row.
- ``deepfm`` ``logit = MLP(x0 -> hidden -> 1) + first-order + FM(e)``, FM the second-order term over
             the field vectors (pairs of fields; keys of one multi-hot field are pooled first).
- ``dcn``    DCN-v2: ``x_L = CrossNet(x0)`` (full-rank cross layers) in parallel with the deep tower
             ``h = MLP(x0 -> hidden)`` (ReLU after every layer; absent for ``hidden=()``), then
             ``logit = [x_L | h] @ W + b``.
- ``dlrm``   ``b = MLP(dense -> bottom_mlp)`` (ReLU after every layer, ends at d), dot products of
             every pair of ``[b, e_1, ..., e_F]`` (lower triangle, no self terms), then
             ``logit = MLP([b | dots] -> hidden -> 1)``. Without dense features: no ``b``, dots of
             the field vectors only.
"""

from __future__ import annotations

import numpy as np

from . import _layers as L
from ._base import FieldModel

__all__ = ["CTRModel", "WideDeep", "DeepFM", "DCN", "DLRM", "MODELS", "make_model", "dense_shapes"]


class CTRModel(FieldModel):
    """Field embeddings (weighted sum-pooled) ‖ dense features -> MLP (ReLU) -> logit.

    Dense parameters ``W0, b0, ..., W{L}, b{L}``: ``Wi`` (in, out), ``bi`` (out,), the last layer has
    out = 1; hidden layers He-uniform, the output layer Xavier-uniform, biases 0.
    """

    name = "ctr"

    @classmethod
    def _parts(cls, cfg) -> dict:
        return {"mlp": L.MLP([cfg.n_fields * cfg.emb_dim + cfg.n_dense, *cfg.hidden, 1])}

    def _describe(self) -> str:
        return f"MLP {'->'.join(str(w) for w in (self.input_dim, *self.hidden, 1))} (ReLU)"

    @property
    def input_dim(self) -> int:
        """Width of the MLP input: ``n_fields * emb_dim + n_dense``."""
        return self.n_fields * self.emb_dim + self.n_dense

    @property
    def n_layers(self) -> int:
        return len(self.hidden) + 1

    def _network(self, pooled, dense, ws=None):
        x = self._deep_input(pooled.reshape(-1, self.n_fields, self.emb_dim), dense, ws)
        z, acts = self.mlp.forward(self.xp, self.params, x, ws)
        return z[:, 0], acts

    def _network_backward(self, acts, dz, grads, ws=None):
        return self.mlp.backward(self.params, acts, dz, grads, dx_cols=self.n_fields * self.emb_dim, ws=ws)


class WideDeep(CTRModel):
    """Wide & Deep: the CTR model's MLP plus a wide linear part, one first-order weight per key (in
    the key's row, column ``emb_dim``). Dense parameters as :class:`CTRModel` (same initial values
    for the same seed)."""

    name = "wdl"
    first_order = True

    def _describe(self) -> str:
        return f"{super()._describe()} + wide (a first-order weight per key)"

    def _network(self, pooled, dense, ws=None):
        emb, wide = self._split(pooled)
        z, acts = self.mlp.forward(self.xp, self.params, self._deep_input(emb, dense, ws), ws)
        return z[:, 0] + wide, acts

    def _network_backward(self, acts, dz, grads, ws=None):
        d_x = self.mlp.backward(self.params, acts, dz, grads, dx_cols=self.n_fields * self.emb_dim, ws=ws)
        return self._join(d_x.reshape(-1, self.n_fields, self.emb_dim), dz, ws)


class DeepFM(CTRModel):
    """DeepFM: first-order weights + FM second-order term over the field embeddings + the CTR model's
    MLP, all sharing the embeddings. Dense parameters as :class:`CTRModel`."""

    name = "deepfm"
    first_order = True

    def _describe(self) -> str:
        return f"{super()._describe()} + first-order + FM"

    def _network(self, pooled, dense, ws=None):
        xp, F, d = self.xp, self.n_fields, self.emb_dim
        emb, first = self._split(pooled)
        x = self._deep_input(emb, dense, ws)
        emb = x[:, :F * d].reshape(-1, F, d)  # the embeddings' copy in the MLP input, not pooled's strided view
        second, s = L.fm(xp, emb)
        z, acts = self.mlp.forward(xp, self.params, x, ws)
        return z[:, 0] + first + second, (emb, s, acts)

    def _network_backward(self, ctx, dz, grads, ws=None):
        emb, s, acts = ctx
        d_x = self.mlp.backward(self.params, acts, dz, grads, dx_cols=self.n_fields * self.emb_dim, ws=ws)
        d_emb = L.fm_backward_add(self.xp, emb, s, dz[:, 0], d_x.reshape(emb.shape))  # d_x: the pass's own
        return self._join(d_emb, dz, ws)


class DCN(FieldModel):
    """DCN-v2 (parallel): cross network and deep tower over ``x0``, concatenated into the output layer.

    Dense parameters: deep tower ``W0, b0, ..., W{H-1}, b{H-1}`` (H = len(hidden)), output layer
    ``W{H}`` ((F d + n_dense + hidden[-1]), 1), ``b{H}``, then ``cross{l}_W`` (K, K), ``cross{l}_b``.
    """

    name = "dcn"
    _arch = ("cross_layers",)

    @classmethod
    def _parts(cls, cfg) -> dict:
        K = cfg.n_fields * cfg.emb_dim + cfg.n_dense
        H = len(cfg.hidden)
        return {"deep": L.MLP([K, *cfg.hidden], relu_last=True),
                "out": L.Linear(f"W{H}", f"b{H}", K + (cfg.hidden[-1] if H else 0), 1),
                "cross": L.CrossNet(K, cfg.cross_layers)}

    def _describe(self) -> str:
        K = self.out.fan_in - (self.hidden[-1] if self.hidden else 0)
        tower = f" | MLP {'->'.join(str(w) for w in (K, *self.hidden))} (ReLU)" if self.hidden else ""
        return f"[{len(self.cross.layers)} cross layers {K}x{K}{tower}] -> {self.out.fan_in}->1"

    def _network(self, pooled, dense, ws=None):
        xp, p = self.xp, self.params
        x0 = self._deep_input(pooled.reshape(-1, self.n_fields, self.emb_dim), dense, ws)
        xl, cross_ctx = self.cross.forward(xp, p, x0, ws)
        top = xl
        if self.deep.layers:
            h, acts = self.deep.forward(xp, p, x0, ws)
            K = xl.shape[1]
            top = L.buffer(xp, ws, "top", (xl.shape[0], K + h.shape[1]), self.dtype)
            top[:, :K], top[:, K:] = xl, h
        else:
            acts = None
        z, _ = self.out.forward(p, top, ws)
        return z[:, 0], (top, cross_ctx, acts)

    def _network_backward(self, ctx, dz, grads, ws=None):
        top, cross_ctx, acts = ctx
        xp, p, K = self.xp, self.params, cross_ctx[0].shape[1]
        d_top = self.out.backward(p, top, dz, grads, ws=ws)
        d_x0 = self.cross.backward(xp, p, cross_ctx, d_top[:, :K], grads, ws)  # the pass's own array
        if self.deep.layers:
            d_x0 += self.deep.backward(p, acts, d_top[:, K:], grads, ws=ws)
        return d_x0[:, :self.n_fields * self.emb_dim]


class DLRM(FieldModel):
    """DLRM: bottom MLP over the dense features to the embedding width, pairwise dot interactions of
    it and the field embeddings, top MLP.

    Dense parameters: top MLP ``W0, b0, ..., W{L}, b{L}`` (input ``d + m (m - 1) / 2`` with
    ``m = F + 1``; without dense features ``F (F - 1) / 2``), then bottom ``bot_W{i}``, ``bot_b{i}``.
    """

    name = "dlrm"
    _arch = ("bottom_mlp",)

    @classmethod
    def _parts(cls, cfg) -> dict:
        bottom = L.MLP([cfg.n_dense, *cfg.bottom_widths], prefix="bot_", relu_last=True) if cfg.n_dense else None
        inter = L.DotInteraction(cfg.n_fields + (bottom is not None))
        top_in = inter.out_dim + (cfg.emb_dim if bottom is not None else 0)
        return {"top": L.MLP([top_in, *cfg.hidden, 1]), "bottom": bottom, "inter": inter}

    def _describe(self) -> str:
        top = "->".join(str(l.fan_in) for l in self.top.layers) + "->1"
        bottom = (f"bottom MLP {'->'.join(str(w) for w in (self.n_dense, *self.cfg.bottom_widths))} (ReLU), "
                  if self.bottom is not None else "")
        return f"{bottom}{self.inter.out_dim} pairwise dots of {self.inter.m} vectors, top MLP {top} (ReLU)"

    def _network(self, pooled, dense, ws=None):
        xp, p, F, d = self.xp, self.params, self.n_fields, self.emb_dim
        n = pooled.shape[0]
        t = pooled.reshape(n, F, d)
        bottom_acts = None
        if self.bottom is not None:
            b, bottom_acts = self.bottom.forward(xp, p, dense, ws)
            t = L.buffer(xp, ws, "inter.t", (n, F + 1, d), self.dtype)
            t[:, 0, :], t[:, 1:, :] = b, pooled.reshape(n, F, d)
        dots, _ = self.inter.forward(xp, t, ws)
        x = dots
        if self.bottom is not None:
            x = L.buffer(xp, ws, "top.x", (n, d + dots.shape[1]), self.dtype)
            x[:, :d], x[:, d:] = t[:, 0, :], dots
        z, acts = self.top.forward(xp, p, x, ws)
        return z[:, 0], (t, bottom_acts, acts)

    def _network_backward(self, ctx, dz, grads, ws=None):
        t, bottom_acts, acts = ctx
        xp, p, d = self.xp, self.params, self.emb_dim
        d_x = self.top.backward(p, acts, dz, grads, ws=ws)
        has_bottom = self.bottom is not None
        d_t = self.inter.backward(xp, t, d_x[:, d:] if has_bottom else d_x, ws)
        if has_bottom:
            self.bottom.backward(p, bottom_acts, d_t[:, 0, :] + d_x[:, :d], grads, dx_cols=0, ws=ws)
            d_t = d_t[:, 1:, :]
        return d_t.reshape(d_t.shape[0], self.n_fields * d)


#: model name (``--model``) -> class
MODELS = {cls.name: cls for cls in (CTRModel, WideDeep, DeepFM, DCN, DLRM)}


def make_model(cfg, xp=np) -> FieldModel:
    """The model a :class:`~hps.model.ModelConfig` describes (``cfg.model``), on array module ``xp``."""
    return MODELS[cfg.model].from_config(cfg, xp=xp)


def dense_shapes(cfg) -> dict:
    """``{name: shape}`` of the dense parameters of ``make_model(cfg)``, allocating nothing."""
    return MODELS[cfg.model].dense_shapes(cfg)
