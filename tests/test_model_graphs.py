"""When a model's pooled pass is captured as CUDA graphs and when it runs eagerly (``hps/model/_graphs.py``),
on the host: the capture itself is stood in for (its bits are checked on a GPU by
``tests/gpu/test_pass_graphs_gpu.py``)."""

import types

import numpy as np
import pytest

from hps import _cublas
from hps.errors import InvalidInputError
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
    monkeypatch.setattr(_cublas._MODE, "_mode", "cublas-gil")
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
    assert graphs.stats() == {"shapes": 2, "replays": 3, "off": False}


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


def test_graphs_are_made_only_when_asked_for_with_the_products_through_cublas(monkeypatch):
    assert CTRModel(2, 4, hidden=(8,)).__dict__["_graphs"] is None   # NumPy: no graphs

    class Stream:
        def begin_capture(self):
            pass

    fake_cupy = types.ModuleType("cupy")
    fake_cupy.cuda = types.SimpleNamespace(Stream=Stream)
    m = CTRModel(2, 4, hidden=(8,))
    m.xp = fake_cupy
    monkeypatch.setattr(_cublas._MODE, "_mode", "cublas-gil")
    monkeypatch.delenv("HPS_CUDA_GRAPHS", raising=False)
    assert G.PassGraphs.for_model(m) is None                  # opt-in
    monkeypatch.setenv("HPS_CUDA_GRAPHS", "1")
    assert isinstance(G.PassGraphs.for_model(m), G.PassGraphs)
    monkeypatch.setattr(_cublas._MODE, "_mode", "cupy")       # CuPy's matmul cannot be captured
    with pytest.warns(RuntimeWarning, match="HPS_CUDA_GEMM=cublas-gil"):
        assert G.PassGraphs.for_model(m) is None
    monkeypatch.setenv("HPS_CUDA_GRAPHS", "yes")
    with pytest.raises(InvalidInputError, match="HPS_CUDA_GRAPHS .* must be one of 0, 1"):
        G.PassGraphs.for_model(m)


def test_no_capture_once_the_products_went_back_to_cupy(graphs, monkeypatch):
    monkeypatch.setattr(_cublas._MODE, "_mode", "cupy")       # e.g. a failed probe in the first, eager pass
    graphs.run(_pooled(16), None, None)
    with pytest.warns(RuntimeWarning, match="went back to CuPy"):
        assert graphs.run(_pooled(16), None, None) is None
    assert graphs.off and not _Captured.made
