"""Evaluation metrics of binary classifiers (host NumPy, vectorised, blocking)."""

from __future__ import annotations

import numpy as np

from .errors import InvalidInputError

__all__ = ["auc", "logloss"]

#: Probabilities are clipped to [LOGLOSS_EPS, 1 - LOGLOSS_EPS] before the log.
LOGLOSS_EPS = 1e-7


def _check(labels, scores, what: str) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise InvalidInputError(f"labels {y.shape} and {what} {s.shape} differ in length")
    if not np.all((y == 0) | (y == 1)):
        raise InvalidInputError("labels must be 0 or 1")
    if np.isnan(s).any():
        raise InvalidInputError(f"{what} contain NaN")
    return y, s


def auc(labels, scores) -> float:
    """Area under the ROC curve: P(score of a random positive > that of a random negative), ties
    counting 1/2 (rank statistic, tied scores get their average rank). labels (n,) in {0, 1},
    scores (n,) float. Returns NaN when only one class is present."""
    y, s = _check(labels, scores, "scores")
    n_pos = float(y.sum())
    n_neg = y.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="stable")
    ss = s[order]
    # Tie groups of the sorted scores: [starts[g], ends[g]) share the average 1-based rank.
    new = np.empty(ss.shape[0], dtype=bool)
    new[0] = True
    np.not_equal(ss[1:], ss[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], ss.shape[0])
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.repeat(avg_rank, ends - starts)
    rank_sum_pos = float(ranks[y[order] == 1].sum())
    return (rank_sum_pos - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def logloss(labels, probs, eps: float = LOGLOSS_EPS) -> float:
    """Mean binary cross-entropy of probabilities ``probs`` (n,) clipped to [eps, 1 - eps] against
    ``labels`` (n,) in {0, 1}. NaN for empty input."""
    y, p = _check(labels, probs, "probs")
    if y.shape[0] == 0:
        return float("nan")
    p = np.clip(p, eps, 1.0 - eps)
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))
