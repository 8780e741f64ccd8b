"""When a model's pooled pass is captured as CUDA graphs and when it runs eagerly (``hps/model/_graphs.py``),
on the host: the capture itself is stood in for (its bits are checked on a GPU by
``tests/gpu/test_pass_graphs_gpu.py``)."""

import types

import numpy as np
import pytest

from hps.model import CTRModel
from hps.model import _graphs as G


class _Captured:
    made = []

    def __init__(self, model, pooled, dense):
        if getattr(model, "refuse", False):
            raise RuntimeError("operation not permitted when stream is capturing")
        self.shape = pooled.shape
        _Captured.made.append(self)

    def replay(self, pooled, dense, loss_grad):
        return "replayed", self.shape


@pytest.fixture
def graphs(monkeypatch):
    monkeypatch.setattr(G, "_Graphs", _Captured)
    _Captured.made = []
    return G.PassGraphs(CTRModel(2, 4, hidden=(8,), seed=0))


def _pooled(n):
    return np.zeros((n, 8), np.float32)


def test_a_shape_runs_eagerly_first_then_replays_its_one_capture(graphs):
    assert graphs.run(_pooled(16), None, None) is None
    assert graphs.run(_pooled(16), None, None) == ("replayed", (16, 8))
    assert graphs.run(_pooled(16), None, None) == ("replayed", (16, 8))
    assert graphs.run(_pooled(8), None, None) is None
    assert graphs.run(_pooled(8), None, None) == ("replayed", (8, 8))
    assert [c.shape for c in _Captured.made] == [(16, 8), (8, 8)]


def test_shapes_past_the_limit_run_eagerly(graphs):
    for n in range(1, G.MAX_SHAPES + 3):
        graphs.run(_pooled(n), None, None)
        graphs.run(_pooled(n), None, None)
    assert len(graphs.graphs) == G.MAX_SHAPES
    assert graphs.run(_pooled(G.MAX_SHAPES + 2), None, None) is None


def test_a_refused_capture_warns_once_and_turns_graphs_off(graphs):
    graphs.model.refuse = True
    graphs.run(_pooled(16), None, None)
    with pytest.warns(RuntimeWarning, match="HPS_CUDA_GRAPHS=0"):
        assert graphs.run(_pooled(16), None, None) is None
    assert graphs.off and graphs.run(_pooled(16), None, None) is None and not _Captured.made


def test_host_models_and_hps_cuda_graphs_0_run_eagerly(monkeypatch):
    assert CTRModel(2, 4, hidden=(8,)).__dict__["_graphs"] is None   # NumPy: no graphs

    class Stream:
        def begin_capture(self):
            pass

    fake_cupy = types.ModuleType("cupy")
    fake_cupy.cuda = types.SimpleNamespace(Stream=Stream)
    m = CTRModel(2, 4, hidden=(8,))
    m.xp = fake_cupy
    assert isinstance(G.PassGraphs.for_model(m), G.PassGraphs)
    monkeypatch.setenv("HPS_CUDA_GRAPHS", "0")
    assert G.PassGraphs.for_model(m) is None
