"""On a real GPU, ``hps._driver_launch`` launches hps's kernels with one ``cuLaunchKernel`` call each:
its probe passes in both GIL modes, launches really take that path, and a table driven through it ends
as one driven through Numba's launch."""

import numpy as np
import pytest

from hps import HashTable
from hps import _driver_launch as D

pytestmark = pytest.mark.gpu


@pytest.fixture
def launch_mode():
    before = D.mode()
    yield D.set_mode
    D.set_mode(before)


@pytest.mark.parametrize("hold_gil", [False, True], ids=["driver", "driver-gil"])
def test_probe_reads_every_parameter(hold_gil):
    assert D.probe(hold_gil) is None


def _drive(mode, set_mode):
    set_mode(mode)
    rng = np.random.default_rng(3)
    t = HashTable(1 << 14, 16, device="cuda", dtype=np.float32)
    for _ in range(4):
        k = rng.integers(0, 1 << 13, 4096, dtype=np.uint64)
        t.accumulate(k, rng.integers(-4, 4, (4096, 16)).astype(np.float32))
    t.erase(rng.integers(0, 1 << 13, 512, dtype=np.uint64))
    k, v = t.export()
    o = np.argsort(k)
    return k[o], v[o]


@pytest.mark.parametrize("mode", ["driver", "driver-gil"])
def test_table_through_the_driver_equals_numba(mode, launch_mode, monkeypatch):
    calls = []
    real = D._driver_call

    def counted(hold_gil):
        calls.append(hold_gil)
        return real(hold_gil)

    monkeypatch.setattr(D, "_driver_call", counted)
    k1, v1 = _drive(mode, launch_mode)
    assert calls and set(calls) == {mode == "driver-gil"}, "no launch went through cuLaunchKernel"
    n = len(calls)
    k0, v0 = _drive("numba", launch_mode)
    assert len(calls) == n, "mode numba still launched through the driver"
    np.testing.assert_array_equal(k1, k0)
    np.testing.assert_array_equal(v1, v0)
