"""``hps.gpu.init_rows_async`` (rows of new keys made on the device) writes exactly the bits the host's
``RowInitializer`` writes, and only the rows it is given (run with ``NUMBA_ENABLE_CUDASIM=1``)."""

import numpy as np
import pytest

from hps.errors import InvalidInputError
from hps.gpu import init_rows_async
from hps.mem import RowInitializer

pytestmark = [pytest.mark.cudasim, pytest.mark.filterwarnings("error:overflow encountered:RuntimeWarning")]


@pytest.mark.parametrize("emb_dim,width,seed,scale,state", [(3, 3, 0, 0.01, 0.0), (4, 13, 7, 0.05, 0.1),
                                                            (1, 2, 2**64 - 1, 1.0, -2.5)])
def test_device_births_equal_the_hosts_bit_for_bit(emb_dim, width, seed, scale, state):
    rng = np.random.default_rng(seed % 1000)
    init = RowInitializer(emb_dim, width, seed=seed, scale=scale, state_value=state)
    keys = np.concatenate([rng.integers(0, 2**63, 37).astype(np.uint64) * np.uint64(2) + np.uint64(1),
                           np.array([0, 2**64 - 2], np.uint64)])
    idx = np.flatnonzero(rng.random(keys.shape[0]) < 0.7).astype(np.int64)
    out = np.full((keys.shape[0], width), np.nan, np.float32)
    init_rows_async(keys, idx, init, out)
    want = init(keys)
    np.testing.assert_array_equal(out[idx].view(np.uint32), want[idx].view(np.uint32))
    rest = np.setdiff1d(np.arange(keys.shape[0]), idx)
    assert np.isnan(out[rest]).all()  # rows not asked for are not touched


def test_a_mismatched_output_is_refused():
    init = RowInitializer(2, 4)
    with pytest.raises(InvalidInputError, match="row width"):
        init_rows_async(np.zeros(3, np.uint64), np.zeros(1, np.int64), init, np.zeros((3, 5), np.float32))
