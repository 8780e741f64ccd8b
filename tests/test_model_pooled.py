"""``FieldModel.forward_backward_pooled``: the entry point GPU-resident training calls with pooled input
already on the device and a loss-gradient callback, so nothing is read back. It must give the
gradients of ``forward_backward`` for every model (pooling and its transpose done outside)."""

import numpy as np
import pytest

from hps.model import MODELS
from hps.model import _layers as L
from hps.model._base import _sigmoid
from tests.test_model_zoo import _setup


@pytest.mark.parametrize("n_dense", [0, 2])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_pooled_entry_point_matches_forward_backward(name, n_dense):
    if name == "dlrm" and n_dense == 0:
        n_dense = 1  # exercised with a bottom MLP; dlrm without dense features is covered elsewhere
    m, b, uniq, inv, rows = _setup(name, n_dense=n_dense)
    n_total = len(b) + 5  # a share of a larger global mini-batch
    loss, _, g_rows, g_dense = m.forward_backward(rows, inv, b, n_total=n_total)

    inv64, f = inv.astype(np.int64), b.field.astype(np.int32)
    w, off = b.weights.astype(m.dtype), b.offsets.astype(np.int64)
    pooled = L.pool(np, rows, inv64, f, w, off, len(b), m.n_fields, True)
    y = b.labels.astype(m.dtype)
    seen = []

    def loss_grad(z):  # what bce_loss_grad_async does on the device
        seen.append((np.maximum(z, 0) - y * z + np.log1p(np.exp(-np.abs(z)))).sum())
        return (_sigmoid(np, z) - y) / m.dtype.type(n_total)

    dense = b.dense.astype(m.dtype) if m.n_dense else None
    d_pooled, grads = m.forward_backward_pooled(pooled, dense, loss_grad)
    assert d_pooled.flags.c_contiguous and d_pooled.shape == pooled.shape
    got_rows = L.pool_backward(np, d_pooled, uniq.shape[0], inv64, f, w, off, m.n_fields, True)
    assert len(seen) == 1 and seen[0] / n_total == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(got_rows, g_rows, rtol=1e-12, atol=1e-14)
    assert list(grads) == list(g_dense)
    for k in grads:
        np.testing.assert_allclose(grads[k], g_dense[k], rtol=1e-12, atol=1e-14, err_msg=k)
