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
