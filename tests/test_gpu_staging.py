"""``hps.gpu.PinnedStaging`` on the host (NumPy stands for the device, as under the CUDA simulator): a
batch's arrays go up packed in one copy, come back as views with their shapes and dtypes, and the
ledger counts the packed bytes; the buffer is reused, grown when a batch does not fit."""

import numpy as np
import pytest

from hps.errors import InvalidTypeError
from hps.gpu import PinnedStaging, TransferLedger


def _batch(n, nnz, d, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**63, nnz, dtype=np.uint64), rng.integers(0, 9, nnz).astype(np.int32),
            rng.random(nnz, dtype=np.float32), np.sort(rng.integers(0, nnz, n + 1)).astype(np.int64),
            rng.random(n, dtype=np.float32), rng.random((n, d), dtype=np.float32)]


def test_arrays_go_up_packed_and_come_back_as_typed_views():
    led = TransferLedger(np)
    st = PinnedStaging(np, led)
    host = _batch(5, 7, 3)  # 7 int32 / float32 (28 B), 5 and 5 x 3 float32 (20, 60 B): 4 B of padding each
    dev = st.upload(host, "plan")
    for h, d in zip(host, dev):
        assert d.dtype == h.dtype and d.shape == h.shape
        np.testing.assert_array_equal(d, h)
        assert d.ctypes.data % 8 == 0
    raw = sum(a.nbytes for a in host)
    assert led.metrics()["h2d_bytes"]["plan"] == raw + 4 * 4 == st.capacity
    was = int(dev[0][0])
    host[0][0] = np.uint64(was + 1)  # the device arrays are a copy
    assert int(dev[0][0]) == was


def test_the_buffer_is_reused_and_grows_only_when_a_batch_does_not_fit():
    led = TransferLedger(np)
    st = PinnedStaging(np, led)
    st.upload(_batch(8, 20, 2), "plan")
    cap = st.capacity
    small = st.upload(_batch(4, 10, 2, seed=1), "plan")
    assert st.capacity == cap  # reused
    np.testing.assert_array_equal(small[3], _batch(4, 10, 2, seed=1)[3])
    st.upload(_batch(40, 100, 2), "plan")
    assert st.capacity >= 2 * cap
    with pytest.raises(InvalidTypeError, match="host NumPy"):
        class Dev:
            __cuda_array_interface__ = {"shape": (1,), "typestr": "<u8", "data": (0, False), "version": 3}

            def __array__(self, dtype=None, copy=None):
                return np.zeros(1, np.uint64)

        st.upload([Dev()], "plan")
