"""auc and logloss against slow by-the-definition references."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hps.errors import InvalidInputError
from hps.metrics import LOGLOSS_EPS, auc, logloss


def _auc_pairs(y, s):
    pos = [si for yi, si in zip(y, s) if yi == 1]
    neg = [si for yi, si in zip(y, s) if yi == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 5)), min_size=2, max_size=40))
def test_auc_matches_pairwise_definition_with_ties(pairs):
    y = [p[0] for p in pairs]
    s = [p[1] / 5.0 for p in pairs]
    if 0 < sum(y) < len(y):
        assert auc(y, s) == pytest.approx(_auc_pairs(y, s), abs=1e-12)
    else:
        assert math.isnan(auc(y, s))


def test_auc_known_values():
    assert auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert auc([0, 1], [0.5, 0.5]) == 0.5
    assert auc([1, 0, 1], [3, 2, 1]) == 0.5
    y = np.random.default_rng(0).integers(0, 2, 100_000)
    assert auc(y, y) == 1.0 and auc(y, -y) == 0.0


def test_logloss():
    y = np.array([1, 0, 1, 0])
    p = np.array([0.9, 0.2, 0.5, 0.0])
    want = -np.mean([math.log(0.9), math.log(0.8), math.log(0.5), math.log(1 - LOGLOSS_EPS)])
    assert logloss(y, p) == pytest.approx(want)
    assert logloss([1], [0.0]) == pytest.approx(-math.log(LOGLOSS_EPS))
    assert math.isfinite(logloss([0, 1], [1.0, 0.0]))


def test_bad_input():
    with pytest.raises(InvalidInputError, match="length"):
        auc([0, 1], [0.1])
    with pytest.raises(InvalidInputError, match="0 or 1"):
        logloss([2], [0.5])
    with pytest.raises(InvalidInputError, match="NaN"):
        auc([0, 1], [0.1, float("nan")])
