"""By-the-book NumPy CTR model and optimizers: Python loops, float64, no cleverness.

Fast paths in ``hps.model`` are tested against these.
"""

from __future__ import annotations

import math

import numpy as np


def pool(emb_rows, inv, batch, n_fields):
    """(n, n_fields * d) weighted sum of each example's embeddings, per field."""
    d = emb_rows.shape[1]
    out = np.zeros((len(batch), n_fields * d))
    for e in range(len(batch)):
        for k in range(batch.offsets[e], batch.offsets[e + 1]):
            f = int(batch.field[k])
            out[e, f * d:(f + 1) * d] += float(batch.weights[k]) * emb_rows[inv[k]].astype(np.float64)
    return out


def pool_backward(grad_pooled, inv, batch, u, d):
    """(u, d): for each unique row, the sum over its occurrences of weight * pooled gradient."""
    out = np.zeros((u, d))
    for e in range(len(batch)):
        for k in range(batch.offsets[e], batch.offsets[e + 1]):
            f = int(batch.field[k])
            out[inv[k]] += float(batch.weights[k]) * grad_pooled[e, f * d:(f + 1) * d]
    return out


def forward(params, emb_rows, inv, batch, n_fields, n_total=None):
    """(loss, probs): loss = sum of per-example BCE / (n_total or n), computed one example at a time."""
    n_layers = len(params) // 2
    x = np.concatenate([pool(emb_rows, inv, batch, n_fields), batch.dense.astype(np.float64)], axis=1)
    denom = len(batch) if n_total is None else n_total
    loss, probs = 0.0, []
    for e in range(len(batch)):
        h = x[e]
        for i in range(n_layers):
            h = h @ params[f"W{i}"].astype(np.float64) + params[f"b{i}"].astype(np.float64)
            if i < n_layers - 1:
                h = np.maximum(h, 0.0)
        z = float(h[0])
        y = float(batch.labels[e])
        p = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
        # -[y log p + (1-y) log(1-p)] written without overflow
        loss += max(z, 0.0) - y * z + math.log1p(math.exp(-abs(z)))
        probs.append(p)
    return (loss / denom if denom else 0.0), np.array(probs)


def forward_backward(params, emb_rows, inv, batch, n_fields, n_total=None):
    """(loss, probs (n,), grad_emb (u, d), {name: grad}) by backpropagation one example at a time,
    float64. The loss is that of :func:`forward`: sum of per-example BCE / (n_total or n)."""
    n_layers = len(params) // 2
    W = [params[f"W{i}"].astype(np.float64) for i in range(n_layers)]
    b = [params[f"b{i}"].astype(np.float64) for i in range(n_layers)]
    d = emb_rows.shape[1]
    x = np.concatenate([pool(emb_rows, inv, batch, n_fields), batch.dense.astype(np.float64)], axis=1)
    denom = len(batch) if n_total is None else n_total
    grads = {k: np.zeros(v.shape) for k, v in params.items()}
    grad_pooled = np.zeros((len(batch), n_fields * d))
    loss, probs = 0.0, []
    for e in range(len(batch)):
        acts, pre = [x[e]], []           # acts[i]: input of layer i; pre[i]: its output before ReLU
        for i in range(n_layers):
            pre.append(acts[i] @ W[i] + b[i])
            acts.append(np.maximum(pre[i], 0.0) if i < n_layers - 1 else pre[i])
        z, y = float(pre[-1][0]), float(batch.labels[e])
        p = 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))
        loss += max(z, 0.0) - y * z + math.log1p(math.exp(-abs(z)))
        probs.append(p)
        delta = np.array([(p - y) / denom])  # d loss / d pre[-1]
        for i in reversed(range(n_layers)):
            grads[f"W{i}"] += np.outer(acts[i], delta)
            grads[f"b{i}"] += delta
            back = W[i] @ delta
            delta = back * (pre[i - 1] > 0) if i > 0 else back
        grad_pooled[e] = delta[:n_fields * d]
    g_emb = pool_backward(grad_pooled, inv, batch, emb_rows.shape[0], d)
    return (loss / denom if denom else 0.0), np.array(probs), g_emb, grads


def numerical_grad(f, x, h=1e-6):
    """Central differences of scalar f() w.r.t. every element of x (modified in place and restored)."""
    g = np.zeros_like(x, dtype=np.float64)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        i = it.multi_index
        old = x[i]
        x[i] = old + h
        fp = f()
        x[i] = old - h
        fm = f()
        x[i] = old
        g[i] = (fp - fm) / (2 * h)
    return g


def adagrad_step(w, acc, g, lr, eps):
    """Element by element: acc += g^2; w -= lr g / (sqrt(acc) + eps). Returns new (w, acc)."""
    w, acc = w.astype(np.float64).copy(), acc.astype(np.float64).copy()
    for i in np.ndindex(w.shape):
        acc[i] += g[i] * g[i]
        w[i] -= lr * g[i] / (math.sqrt(acc[i]) + eps)
    return w, acc


def adam_step(p, m, v, g, t, lr, b1, b2, eps):
    """Step ``t`` (from 1) of Adam, element by element, in place on float64 p, m, v."""
    for i in np.ndindex(p.shape):
        m[i] = b1 * m[i] + (1 - b1) * g[i]
        v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
        m_hat = m[i] / (1 - b1 ** t)
        v_hat = v[i] / (1 - b2 ** t)
        p[i] -= lr * m_hat / (math.sqrt(v_hat) + eps)


def adam_steps(p, grads, lr, b1, b2, eps):
    """Apply Adam for each gradient in ``grads`` (list) from zero moments; returns (p, m, v)."""
    p = p.astype(np.float64).copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        adam_step(p, m, v, g, t, lr, b1, b2, eps)
    return p, m, v


def train(batches, emb, params, n_fields, *, epochs=1, sparse="adagrad", dense="adam", lr=0.05,
          dense_lr=1e-3, adagrad_init=0.0, adagrad_eps=1e-10, betas=(0.9, 0.999), adam_eps=1e-8):
    """Mini-batch training by the book, float64: for every mini-batch (a Batch) in order, the rows of
    its distinct keys, :func:`forward_backward`, one sparse step per distinct key (Adagrad or SGD, one
    key at a time) and one dense step (Adam or SGD). ``emb``: {key: initial embedding (d,)} for every
    key of ``batches``; ``params``: initial dense parameters. -> ({key: embedding}, {name: param})."""
    emb = {k: np.asarray(v, dtype=np.float64).copy() for k, v in emb.items()}
    acc = {k: np.full(v.shape, adagrad_init) for k, v in emb.items()}
    params = {k: np.asarray(v, dtype=np.float64).copy() for k, v in params.items()}
    moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in params.items()}
    d = len(next(iter(emb.values())))
    t = 0
    for _ in range(epochs):
        for batch in batches:
            uniq, inv = np.unique(batch.keys, return_inverse=True)
            rows = np.array([emb[k] for k in uniq.tolist()]).reshape(uniq.shape[0], d)
            _, _, g_emb, grads = forward_backward(params, rows, inv, batch, n_fields)
            for j, k in enumerate(uniq.tolist()):
                if sparse == "adagrad":
                    emb[k], acc[k] = adagrad_step(emb[k], acc[k], g_emb[j], lr, adagrad_eps)
                else:
                    emb[k] = emb[k] - lr * g_emb[j]
            t += 1
            for name, p in params.items():
                if dense == "adam":
                    adam_step(p, *moments[name], grads[name], t, dense_lr, *betas, adam_eps)
                else:
                    p -= dense_lr * grads[name]
    return emb, params


def random_batch(rng, n, n_fields, n_dense=0, max_keys=4, vocab=7, weighted=True, empty_field_p=0.3):
    """A Batch of n examples: each example has 0..max_keys keys in each field (some fields empty,
    duplicates within an example allowed), weights in [0.5, 2) or all 1, labels 0/1."""
    from hps.data import Batch, make_keys

    fields, values = [], []
    counts = np.zeros(n, dtype=np.int64)
    for e in range(n):
        for f in range(n_fields):
            if rng.random() < empty_field_p:
                continue
            c = int(rng.integers(1, max_keys + 1))
            fields += [f] * c
            values += list(rng.integers(0, vocab, c))
            counts[e] += c
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    perm = np.concatenate([[]] + [offsets[e] + rng.permutation(counts[e]) for e in range(n)]).astype(np.int64)
    field = np.array(fields, dtype=np.int32)[perm]  # keys of an example in no particular field order
    keys = make_keys(field, np.array(values, dtype=np.uint64)[perm])
    nnz = keys.shape[0]
    weights = (rng.uniform(0.5, 2.0, nnz) if weighted else np.ones(nnz)).astype(np.float32)
    labels = rng.integers(0, 2, n).astype(np.float32)
    dense = rng.normal(size=(n, n_dense)).astype(np.float32)
    return Batch(labels, dense, keys, field, weights, offsets, n_fields)
