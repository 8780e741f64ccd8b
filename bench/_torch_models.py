"""PyTorch twins of the hps models and row optimizers, for ``bench.peer_torch`` and the torch tests.

:class:`TorchNet` is each ``hps.model`` network written with torch operations (autograd does the
backward, independently of hps's hand-written one), its dense parameters copied from an hps model
under the same names and layouts (``W`` is (in, out)). :class:`TorchRows` is one embedding table of
``row_params`` columns (``nn.EmbeddingBag(mode="sum")``, sparse gradients) plus the row optimizer's
state, stepped with the formulas of ``hps.model._row_optim``: ``torch.optim.Adagrad`` / ``SGD``
where torch has the same optimizer (no L2), torch tensor operations otherwise (row-wise Adagrad,
Adam with a per-row step count, L2 on the used rows).

Imports torch lazily: importing this module does not need it.
"""

from __future__ import annotations

import numpy as np


def _torch():
    import torch

    return torch


def make_net(model):
    """A ``torch.nn.Module`` computing ``model``'s logits (see :class:`TorchNet`)."""
    torch = _torch()

    class TorchNet(torch.nn.Module):
        """forward(pooled (n, F * row_params), dense (n, n_dense) or None) -> logits (n,)."""

        def __init__(self):
            super().__init__()
            self.name, self.F, self.D, self.P = model.name, model.n_fields, model.emb_dim, model.row_params
            self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(torch.from_numpy(np.array(v)))
                                             for k, v in model.state_dict().items()})
            self.n_top = sum(1 for k in self.p if k.startswith("W"))
            self.n_cross = sum(1 for k in self.p if k.startswith("cross") and k.endswith("_W"))
            self.n_bottom = sum(1 for k in self.p if k.startswith("bot_W"))
            if self.name == "dlrm":
                li, lj = np.tril_indices(self.F + (self.n_bottom > 0), -1)
                self.li, self.lj = torch.from_numpy(li), torch.from_numpy(lj)

        def mlp(self, x, prefix, n, relu_last):
            for i in range(n):
                x = x @ self.p[f"{prefix}W{i}"] + self.p[f"{prefix}b{i}"]
                if i < n - 1 or relu_last:
                    x = torch.relu(x)
            return x

        def forward(self, pooled, dense):
            n = pooled.shape[0]
            p3 = pooled.view(n, self.F, self.P)
            emb = p3[:, :, :self.D]
            x0 = emb.reshape(n, self.F * self.D)
            if dense is not None:
                x0 = torch.cat([x0, dense], dim=1)
            if self.name in ("ctr", "wdl", "deepfm"):
                z = self.mlp(x0, "", self.n_top, False)[:, 0]
                if self.name != "ctr":
                    z = z + p3[:, :, self.D].sum(dim=1)
                if self.name == "deepfm":
                    s = emb.sum(dim=1)
                    z = z + 0.5 * ((s * s).sum(dim=1) - (emb * emb).sum(dim=(1, 2)))
                return z
            if self.name == "dcn":
                x = x0
                for l in range(self.n_cross):
                    x = x0 * (x @ self.p[f"cross{l}_W"] + self.p[f"cross{l}_b"]) + x
                H = self.n_top - 1
                if H:
                    x = torch.cat([x, self.mlp(x0, "", H, True)], dim=1)
                return (x @ self.p[f"W{H}"] + self.p[f"b{H}"])[:, 0]
            # dlrm
            t = emb
            if self.n_bottom:
                b = self.mlp(dense, "bot_", self.n_bottom, True)
                t = torch.cat([b[:, None, :], emb], dim=1)
            dots = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]
            top = torch.cat([t[:, 0, :], dots], dim=1) if self.n_bottom else dots
            return self.mlp(top, "", self.n_top, False)[:, 0]

    return TorchNet()


class TorchRows:
    """The embedding table ``(V, row_params)`` and its row optimizer, in torch.

    ``table`` (V, P) float initial parameters; ``opt`` an hps row optimizer whose name and
    hyperparameters are copied (its state starts at ``opt.initial_state_value``, as in hps).
    ``bag(idx, offsets, weights)`` pools; ``step()`` applies the optimizer to the rows with a gradient.
    """

    def __init__(self, table, opt, dtype):
        torch = _torch()
        self.torch = torch
        V, P = table.shape
        self.bag = torch.nn.EmbeddingBag(max(1, V), P, mode="sum", sparse=True, dtype=dtype)
        with torch.no_grad():
            self.bag.weight[:V] = torch.from_numpy(np.ascontiguousarray(table))
        self.opt, self.P = opt, P
        self.builtin = None
        if opt.l2 == 0 and opt.name == "adagrad":
            self.builtin = torch.optim.Adagrad(self.bag.parameters(), lr=opt.lr, eps=opt.eps,
                                               initial_accumulator_value=opt.initial_accumulator)
        elif opt.l2 == 0 and opt.name == "sgd":
            self.builtin = torch.optim.SGD(self.bag.parameters(), lr=opt.lr)
        else:
            self.state = torch.full((max(1, V), opt.state_width(P)), opt.initial_state_value, dtype=dtype)

    def zero_grad(self):
        self.bag.weight.grad = None

    @property
    def weight(self):
        return self.bag.weight

    def step(self):
        if self.builtin is not None:
            self.builtin.step()
            return
        torch, o, P = self.torch, self.opt, self.P
        g = self.bag.weight.grad.coalesce()
        idx, g = g.indices()[0], g.values()
        with torch.no_grad():
            w = self.bag.weight[idx]
            if o.l2:
                g = g + o.l2 * w
            st = self.state[idx]
            if o.name == "sgd":
                w = w - o.lr * g
            elif o.name == "adagrad":
                st = st + g * g
                w = w - o.lr * g / (st.sqrt() + o.eps)
            elif o.name == "rowwise-adagrad":
                st = st + (g.double() ** 2).mean(dim=1, keepdim=True).to(g.dtype)
                w = w - o.lr * g / (st.sqrt() + o.eps)
            else:  # adam, with the row's own step count in the last state column
                b1, b2 = o.betas
                t = st[:, 2 * P:] + 1
                m = b1 * st[:, :P] + (1 - b1) * g
                v = b2 * st[:, P:2 * P] + (1 - b2) * g * g
                t64 = t.double()
                step = (o.lr / (1 - b1 ** t64)).to(g.dtype)
                bc2 = (1 - b2 ** t64).sqrt().to(g.dtype)
                w = w - step * m / (v.sqrt() / bc2 + o.eps)
                st = torch.cat([m, v, t], dim=1)
            self.bag.weight[idx] = w
            self.state[idx] = st
