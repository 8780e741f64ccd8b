"""The array-module seam (hps._xp) and the transfer ledger (hps.gpu.TransferLedger) on the host."""

import threading

import numpy as np
import pytest

from hps._xp import array_module, simulated
from hps.errors import DeviceUnavailableError, InvalidInputError, InvalidTypeError
from hps.gpu import PURPOSES, TransferLedger
from hps.train import _trainer


def test_cpu_is_numpy_and_unknown_devices_are_refused():
    assert array_module("cpu") is np
    with pytest.raises(InvalidInputError, match="device must be one of"):
        array_module("tpu")


def test_cuda_under_the_simulator_is_numpy(monkeypatch):
    from numba import config

    monkeypatch.setattr(config, "ENABLE_CUDASIM", 1)
    assert simulated()
    assert array_module("cuda") is np
    assert _trainer.array_module is array_module  # the trainer goes through the seam


def test_cuda_without_a_gpu_is_one_clear_error(monkeypatch):
    from numba import config

    monkeypatch.setattr(config, "ENABLE_CUDASIM", 0)
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            pytest.skip("a GPU is present")
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - no driver: the case under test
        pass
    with pytest.raises(DeviceUnavailableError, match="--device cuda"):
        array_module("cuda")


def test_ledger_counts_bytes_by_direction_and_purpose():
    led = TransferLedger(np)
    assert led.metrics() == {"h2d_bytes": dict.fromkeys(PURPOSES, 0), "d2h_bytes": dict.fromkeys(PURPOSES, 0),
                             "peer_bytes": 0, "minibatches": 0, "batch_bytes": 0, "device_dedup_batches": 0}
    host = np.arange(10, dtype=np.int64)
    dev = led.to_device(host, "plan")
    assert isinstance(dev, np.ndarray) and dev is not host and dev.tolist() == host.tolist()
    host[0] = 99  # a copy, not a view
    assert dev[0] == 0
    led.to_device(np.ones((3, 4), np.float32)[:, ::2], "fetch")  # non-contiguous: 3 x 2 float32 cross
    out = np.empty(10, np.int64)
    assert led.to_host(dev, "writeback", out=out) is out and out.tolist() == dev.tolist()
    scalar = led.to_host(np.zeros(2, np.float64), "minibatch")
    assert scalar.shape == (2,)
    for _ in range(3):
        led.minibatch()
    m = led.metrics()
    assert m["h2d_bytes"] == {"plan": 80, "fetch": 24, "writeback": 0, "mpi": 0, "minibatch": 0}
    assert m["d2h_bytes"] == {"plan": 0, "fetch": 0, "writeback": 80, "mpi": 0, "minibatch": 16}
    assert m["minibatches"] == 3


def test_ledger_refuses_unknown_purposes_and_wrong_sides():
    led = TransferLedger(np)
    with pytest.raises(InvalidInputError, match="purpose"):
        led.to_device(np.ones(2), "rows")
    with pytest.raises(InvalidInputError, match="purpose"):
        led.to_host(np.ones(2), "misc")

    class FakeDevice:
        __cuda_array_interface__ = {}

    with pytest.raises(InvalidTypeError, match="host NumPy"):
        led.to_device(FakeDevice(), "plan")
    with pytest.raises(InvalidTypeError, match="device array"):
        TransferLedger(object()).to_host(np.ones(2), "plan")  # a NumPy array is no device array on a GPU
    assert led.metrics()["h2d_bytes"]["plan"] == 0


def test_ledger_is_thread_safe():
    led = TransferLedger(np)
    a = np.ones(8, np.uint8)

    def work():
        for _ in range(500):
            led.to_device(a, "plan")
            led.minibatch()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    m = led.metrics()
    assert m["h2d_bytes"]["plan"] == 4 * 500 * 8 and m["minibatches"] == 2000


def test_recorded_and_peer_copies_are_counted_apart():
    led = TransferLedger(np)
    led.record("h2d", "fetch", 40)
    led.record("d2h", "writeback", 8)
    led.peer(24)
    m = led.metrics()
    assert m["h2d_bytes"]["fetch"] == 40 and m["d2h_bytes"]["writeback"] == 8 and m["peer_bytes"] == 24
    with pytest.raises(InvalidInputError, match="direction"):
        led.record("d2d", "fetch", 1)
    with pytest.raises(InvalidInputError, match="purpose"):
        led.record("h2d", "rows", 1)


def test_placement_spreads_parts_round_robin_and_refuses_gpus_it_has_not(monkeypatch):
    from numba import config

    from hps.gpu import Placement
    from hps.table import _placement

    monkeypatch.setattr(config, "ENABLE_CUDASIM", 0)
    monkeypatch.setattr(_placement, "visible_gpus", lambda: 2)
    pl = Placement(5)
    assert pl.gpus == 2 and [pl.device(p) for p in range(5)] == [0, 1, 0, 1, 0]
    assert Placement(1).gpus == 1  # never more GPUs than parts
    with pytest.raises(InvalidInputError, match="only 2 GPU"):
        Placement(4, gpus=3)
    with pytest.raises(InvalidInputError, match="gpus must be a positive integer"):
        Placement(4, gpus=0)
    with pytest.raises(InvalidInputError, match="n_parts"):
        Placement(0)
    # the simulator's one GPU stands in for any number; a copy between two of them is a counted copy
    monkeypatch.setattr(config, "ENABLE_CUDASIM", 1)
    monkeypatch.setattr(_placement, "visible_gpus", lambda: 1)
    pl, led = Placement(4, gpus=3), TransferLedger(np)
    a = np.arange(6, dtype=np.float32)
    assert pl.peer(a, 1, 1, led) is a
    b = pl.peer(a, 0, 2, led)
    assert b is not a and (b == a).all() and led.metrics()["peer_bytes"] == a.nbytes

