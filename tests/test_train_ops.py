"""GPU training operations (hps.gpu._train_ops) check their array contract before launching anything,
so these run without a GPU: on a real (non-simulated) CUDA path a host array is refused, never copied
behind the caller's back."""

import numpy as np
import pytest

from hps import HashTable
from hps._xp import cuda_import_error
from hps.errors import InvalidInputError, InvalidTypeError
from hps.gpu import _row_ops as rops
from hps.gpu import _train_ops as ops
from hps.table import TableView

pytestmark = pytest.mark.skipif(cuda_import_error() is not None, reason="numba-cuda is not importable")


class Dev:
    """The smallest device-array stand-in: what _dev checks (ndim, dtype, shape) on a NumPy array."""

    __cuda_ndarray__ = True

    def __init__(self, a):
        self.a = np.asarray(a)
        self.ndim, self.dtype, self.shape = self.a.ndim, self.a.dtype, self.a.shape


@pytest.fixture
def host_view():
    with HashTable(8, 4).device_view() as v:  # a CPU table's view: NumPy slot arrays
        yield v


def test_host_arrays_are_refused_outside_the_simulator(host_view):
    slots = np.zeros(2, np.int64)
    with pytest.raises(InvalidTypeError, match="view.keys must be a device array"):
        ops.find_slots_async(host_view, np.zeros(2, np.uint64), slots, np.zeros(1))
    view = TableView(*(Dev(a) for a in host_view[:3]), 0)
    with pytest.raises(InvalidTypeError, match="TransferLedger.to_device"):
        ops.find_slots_async(view, np.zeros(2, np.uint64), slots, np.zeros(1))
    with pytest.raises(InvalidTypeError, match="slots must be a device array"):
        rops.sgd_update_async(view, slots, np.zeros((2, 2), np.float32), 0.1)
    with pytest.raises(InvalidTypeError, match="device array"):
        ops.bce_loss_grad_async([0.0], [1.0], 1, np.zeros(1), np.zeros(1))


def test_contracts_are_checked_before_any_launch(host_view):
    d = Dev
    view = TableView(*(Dev(a) for a in host_view[:3]), 0)
    inv, field = d(np.zeros(3, np.int64)), d(np.zeros(3, np.int32))
    w, off = d(np.ones(3, np.float32)), d(np.array([0, 3], np.int64))
    slots = d(np.zeros(1, np.int64))
    with pytest.raises(InvalidTypeError, match="inv must be int64"):
        ops.pool_forward_async(view, slots, d(np.zeros(3, np.int32)), field, w, off,
                               d(np.zeros((1, 2), np.float32)), width=2)
    with pytest.raises(InvalidInputError, match="field must have 3 rows"):
        ops.pool_forward_async(view, slots, inv, d(np.zeros(2, np.int32)), w, off,
                               d(np.zeros((1, 2), np.float32)), width=2)
    with pytest.raises(InvalidInputError, match="col0 \\+ width <= 4"):
        ops.pool_forward_async(view, slots, inv, field, w, off, d(np.zeros((1, 6), np.float32)), width=3,
                               col0=2)
    with pytest.raises(InvalidInputError, match="out must be"):
        ops.pool_forward_async(view, slots, inv, field, w, off, d(np.zeros((1, 5), np.float32)), width=2)
    with pytest.raises(InvalidTypeError, match="weights must be float64"):
        ops.pool_backward_async(d(np.zeros((1, 4))), inv, field, w, off, d(np.zeros((1, 2))))
    with pytest.raises(InvalidInputError, match="grad_pooled must be"):
        ops.pool_backward_async(d(np.zeros((1, 3), np.float32)), inv, field, w, off,
                                d(np.zeros((1, 2), np.float32)))
    with pytest.raises(InvalidInputError, match="grads must have 2 rows"):
        rops.sgd_update_async(view, d(np.zeros(2, np.int64)), d(np.zeros((1, 2), np.float32)), 0.1)
    with pytest.raises(InvalidInputError, match="rows have 4"):
        rops.sgd_update_async(view, slots, d(np.zeros((1, 5), np.float32)), 0.1)
    with pytest.raises(InvalidInputError, match="slots must have 2 rows"):
        ops.find_slots_async(view, d(np.zeros(2, np.uint64)), slots, d(np.zeros(1)))
    with pytest.raises(InvalidTypeError, match="labels must be float32"):
        ops.bce_loss_grad_async(d(np.zeros(2, np.float32)), d(np.zeros(2)), 2, d(np.zeros(2, np.float32)),
                                d(np.zeros(1)))
