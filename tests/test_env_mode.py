"""``hps._env_mode.EnvMode``: a mode read once (``get``) or at each use (``read``), always checked."""

import pytest

from hps._env_mode import EnvMode
from hps.errors import InvalidInputError


def test_get_reads_once_read_follows_the_variable_and_both_refuse_what_is_not_a_mode(monkeypatch):
    m = EnvMode("HPS_TEST_ENV_MODE", ("a", "b"), "a", "test mode")
    monkeypatch.delenv("HPS_TEST_ENV_MODE", raising=False)
    assert m.read() == "a" and m.get() == "a"
    monkeypatch.setenv("HPS_TEST_ENV_MODE", "b")
    assert m.read() == "b" and m.get() == "a"      # get keeps what it read first
    assert m.set("b") == "b" and m.get() == "b"
    monkeypatch.setenv("HPS_TEST_ENV_MODE", "c")
    with pytest.raises(InvalidInputError, match="HPS_TEST_ENV_MODE / test mode must be one of a, b, got 'c'"):
        m.read()
    with pytest.raises(InvalidInputError, match="must be one of a, b"):
        m.set("c")
    assert m.get() == "b"                            # a refused set changes nothing
