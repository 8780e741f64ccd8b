"""``hps._driver_launch`` without a GPU: the parameter values a driver launch packs, the buffer they go
in, and the mode switch. (The layout against every kernel's PTX: ``tests/test_gpu_ptx.py``; the launch
itself on a GPU: ``tests/gpu/test_driver_launch_gpu.py``.)"""

import struct

import numpy as np
import pytest

pytest.importorskip("numba.cuda")
from numba.cuda import types as t  # noqa: E402

from hps import _driver_launch as D  # noqa: E402
from hps.errors import InvalidInputError  # noqa: E402


class FakeDeviceArray:
    """An ``__cuda_array_interface__`` array at a made-up device address."""

    def __init__(self, shape, dtype, ptr, strides=None):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": np.dtype(dtype).str, "data": (ptr, False),
                                         "strides": strides, "version": 3}


def test_pack_values_follows_numba_abi():
    a = FakeDeviceArray((5, 4), np.float32, 0x7F0000001000, strides=(32, 8))
    b = FakeDeviceArray((10,), np.int64, 0x7F0000002000)
    argtypes = (t.float32[:, :], t.int64[::1], t.int32, t.uint64, t.float32, t.float64, t.boolean)
    args = (a, b, np.int32(-7), np.uint64(2 ** 63 + 5), np.float32(1.5), -2.25, True)
    vals = D.pack_values(argtypes, args)
    assert vals[:9] == [0, 0, 20, 4, 0x7F0000001000, 5, 4, 32, 8]
    assert vals[9:16] == [0, 0, 10, 8, 0x7F0000002000, 10, 8]  # strides from the shape when absent
    layout = D.param_layout(argtypes)
    st = struct.Struct("<" + "".join(c for c, _, _ in layout))
    assert st.size == 8 * len(layout)  # one 8-byte slot per parameter
    raw = st.pack(*vals)
    slot = [raw[8 * i:8 * i + 8] for i in range(len(layout))]
    assert struct.unpack("<q", slot[16]) == (-7,) and struct.unpack("<i", slot[16][:4]) == (-7,)
    assert struct.unpack("<Q", slot[17]) == (2 ** 63 + 5,)
    assert struct.unpack("<f", slot[18][:4]) == (1.5,)
    assert struct.unpack("<d", slot[19]) == (-2.25,)
    assert slot[20][:1] == b"\x01"


def test_layout_refuses_what_it_cannot_pack():
    assert D.param_layout((t.float64[::1], t.complex64)) is None
    assert D.param_layout((t.UniTuple(t.int64, 2),)) is None


def test_mode_switch():
    before = D.mode()
    try:
        assert D.set_mode("numba") == "numba" and D.mode() == "numba"
        with pytest.raises(InvalidInputError, match="HPS_CUDA_LAUNCH"):
            D.set_mode("fast")
        assert D.mode() == "numba"
        # in "numba" mode the driver path declines every launch (the caller launches through Numba)
        assert D.launch(object(), 1, 1, 0, ()) is False
    finally:
        D.set_mode(before)


def test_host_arrays_and_huge_ints_are_left_to_numba():
    class Overloads(dict):
        def get(self, *a):
            raise AssertionError("looked up an overload")

    class Dispatcher:  # the arguments' keys decline before any overload is looked up
        overloads = Overloads()

    assert D.launcher_for(Dispatcher(), (np.zeros(3),)) is None
    assert D.launcher_for(Dispatcher(), (2 ** 64 - 1,)) is None


def test_a_launchable_that_is_not_a_numba_dispatcher_is_left_to_it():
    assert D.launcher_for(object(), (np.float32(1),)) is None


def test_a_launch_hands_the_driver_a_pointer_to_each_packed_parameter(monkeypatch):
    """``Launcher.__call__`` without a GPU: a stand-in for ``cuLaunchKernel`` reads the parameters back
    through the pointer array, as the driver does, with the grid, block, stream and function handle."""
    import ctypes

    argtypes = (t.float32[:, :], t.int32, t.float64, t.boolean)

    class Kernel:
        argument_types, entry_name, debug, cooperative = argtypes, "k", False, False

        class _codelibrary:
            @staticmethod
            def get_cufunc():
                class F:
                    handle = 0xABC
                return F()

    seen = {}

    def fake_cu_launch_kernel(handle, gx, gy, gz, bx, by, bz, shmem, stream, params, extra):
        n = len(D.param_layout(argtypes))
        seen.update(handle=handle, grid=(gx, gy, gz), block=(bx, by, bz), stream=stream, extra=extra,
                    slots=[ctypes.string_at(params[i], 8) for i in range(n)])
        return 0

    monkeypatch.setattr(D, "_driver_call", lambda hold_gil: fake_cu_launch_kernel)
    launcher = D.Launcher(Kernel(), D.param_layout(argtypes))
    a = FakeDeviceArray((3, 2), np.float32, 0x1000, strides=(8, 4))
    launcher((5, 1, 1), (32, 8, 1), 77, (a, np.int32(-3), 0.25, False), hold_gil=True)
    assert (seen["handle"], seen["grid"], seen["block"], seen["stream"], seen["extra"]) == \
        (0xABC, (5, 1, 1), (32, 8, 1), 77, None)
    words = [struct.unpack("<q", s)[0] for s in seen["slots"][:9]]
    assert words == [0, 0, 6, 4, 0x1000, 3, 2, 8, 4]
    assert struct.unpack("<i", seen["slots"][9][:4]) == (-3,)
    assert struct.unpack("<d", seen["slots"][10]) == (0.25,)
    assert seen["slots"][11][:1] == b"\x00"

    monkeypatch.setattr(D, "_driver_call", lambda hold_gil: lambda *a: 700)  # CUDA_ERROR_LAUNCH_FAILED
    with pytest.raises(D.DriverLaunchError, match="CUDA error 700.*HPS_CUDA_LAUNCH=numba"):
        launcher((1, 1, 1), (1, 1, 1), 0, (a, np.int32(1), 1.0, True), hold_gil=False)


def test_a_failed_probe_warns_once_and_leaves_every_launch_to_numba(monkeypatch):
    class Dispatcher:
        overloads = {}

    launched = []
    monkeypatch.setattr(D, "launcher_for", lambda d, args: lambda *a: launched.append(a))
    monkeypatch.setitem(D._state, "checked", False)
    monkeypatch.setattr(D._MODE, "_mode", "driver-gil")
    monkeypatch.setattr(D, "probe", lambda hold_gil: "probe kernel read [0.0], expected [5]")
    with pytest.warns(RuntimeWarning, match="failed its check.*launching through Numba"):
        assert D.launch(Dispatcher(), (1, 1, 1), (1, 1, 1), 0, ()) is False
    assert D.mode() == "numba" and launched == []
    assert D.launch(Dispatcher(), (1, 1, 1), (1, 1, 1), 0, ()) is False  # no second probe, no warning

    monkeypatch.setitem(D._state, "checked", False)
    monkeypatch.setattr(D._MODE, "_mode", "driver-gil")
    monkeypatch.setattr(D, "probe", lambda hold_gil: None)
    assert D.launch(Dispatcher(), (2, 1, 1), (64, 1, 1), 0, ("x",)) is True
    assert launched == [((2, 1, 1), (64, 1, 1), 0, ("x",), True)]
