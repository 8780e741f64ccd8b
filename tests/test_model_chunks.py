"""The host pass in chunks of examples on several threads (``hps/model/_chunks.py``) and the layers'
scratch buffers: results against the naive reference, bit-identical for every thread count, returned
arrays never reused, float32 kept throughout."""

import threading

import numpy as np
import pytest

from hps import InvalidInputError
from hps.model import MODELS
from hps.model import _layers as L
from hps.model._chunks import CHUNK_ROWS, ChunkThreads, chunk_bounds
from tests.reference import model as ref
from tests.test_model_zoo import CASES, _model, _ref_loss, _setup


# -- ChunkThreads -------------------------------------------------------------------------------
def test_chunk_bounds_depend_only_on_the_examples():
    assert chunk_bounds(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert chunk_bounds(8, 4) == [(0, 4), (4, 8)]
    assert chunk_bounds(3, 4) == [(0, 3)] and chunk_bounds(0, 4) == [(0, 0)]
    assert chunk_bounds(10, None) == [(0, 10)]


def test_helpers_cpu_seconds_count_the_chunks_they_ran():
    """``helper_cpu_seconds`` grows by the helpers' thread CPU; with one thread there is none."""
    import time

    def spin(i, meet=None):
        if meet is not None:
            meet.wait()                       # both threads take a chunk: the helper runs one
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        return threading.get_ident()

    one = ChunkThreads(1)
    one.run(spin, 4)
    assert one.helper_cpu_seconds == 0.0
    pool = ChunkThreads(2)
    try:
        both = threading.Barrier(2, timeout=30)
        ran = pool.run(lambda i: spin(i, both), 2)
        assert len(set(ran)) == 2
        deadline = time.monotonic() + 10         # the helper adds its CPU right after its chunk
        while pool.helper_cpu_seconds < 0.05 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert 0.05 <= pool.helper_cpu_seconds < 1.0
    finally:
        pool.resize(1)


def test_threads_run_every_chunk_once_in_order_and_concurrently():
    pool = ChunkThreads(3)
    try:
        assert pool.threads == 3
        assert pool.run(lambda i: i * i, 7) == [i * i for i in range(7)]
        # two chunks that each wait for the other to start: finish only if two threads run them
        both = threading.Barrier(2, timeout=10)
        seen = set()

        def meet(i):
            seen.add(threading.get_ident())
            both.wait()
            return i

        assert pool.run(meet, 2) == [0, 1] and len(seen) == 2
        pool.resize(1)
        assert pool.threads == 1 and pool.run(lambda i: threading.get_ident(), 3) == [threading.get_ident()] * 3
        pool.resize(2)
        assert pool.run(lambda i: -i, 5) == [0, -1, -2, -3, -4]
    finally:
        pool.resize(1)
    assert not [t for t in threading.enumerate() if t.name.startswith("hps-chunk-")]


def test_a_failing_chunk_raises_after_every_chunk_ran():
    pool = ChunkThreads(2)
    ran = []

    def work(i):
        ran.append(i)
        if i in (3, 5):
            raise ValueError(f"chunk {i}")
        return i

    try:
        with pytest.raises(ValueError, match="chunk 3"):
            pool.run(work, 8)
        assert sorted(ran) == list(range(8))
        assert pool.run(lambda i: i, 3) == [0, 1, 2]  # the pool still works
        with pytest.raises(InvalidInputError):
            pool.resize(0)
    finally:
        pool.resize(1)


# -- the models in chunks -----------------------------------------------------------------------
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name, n_dense, hidden", CASES)
def test_chunked_pass_matches_the_whole_pass_and_the_reference(name, n_dense, hidden, threads):
    """Chunks of 5 examples (the last one shorter), on 1 or 3 threads, against one chunk (the pass
    the zoo tests check against finite differences) and the reference's loss (float64): for
    forward_backward, predict and the pooled pass (forwards of every chunk, loss_grad once, backwards)."""
    m, b, _, inv, rows = _setup(name, n_dense, hidden, seed=7, n=23)
    whole = _model(name, n_dense, hidden, dtype=np.float64)
    whole.load_state_dict(m.state_dict())
    whole.chunk_rows = None
    m.chunk_rows = 5
    m.set_threads(threads)
    try:
        loss, probs, g_rows, g = m.forward_backward(rows, inv, b, n_total=30)
        wloss, wprobs, wg_rows, wg = whole.forward_backward(rows, inv, b, n_total=30)
        rloss, rprobs = _ref_loss(m, rows, inv, b, n_total=30)
        assert loss == pytest.approx(rloss, rel=1e-12) and loss == pytest.approx(wloss, rel=1e-13)
        np.testing.assert_allclose(probs, rprobs, rtol=1e-12)
        np.testing.assert_allclose(m.predict(rows, inv, b), rprobs, rtol=1e-12)
        np.testing.assert_allclose(g_rows, wg_rows, rtol=1e-12, atol=1e-15)
        assert list(g) == list(m.params)
        for k in g:
            np.testing.assert_allclose(g[k], wg[k], rtol=1e-12, atol=1e-15, err_msg=k)
        keys, dense = m._inputs(rows, inv, b)
        pooled = m._pool(keys, len(b), 0, len(b), None)
        y = b.labels.astype(np.float64)
        d_pooled, g2 = m.forward_backward_pooled(pooled, dense, lambda z: (1 / (1 + np.exp(-z)) - y) / 30)
        np.testing.assert_allclose(L.pool_backward(np, d_pooled, rows.shape[0], *keys[1:], 3, True), wg_rows,
                                   rtol=1e-12, atol=1e-15)
        for k in g2:
            np.testing.assert_allclose(g2[k], wg[k], rtol=1e-12, atol=1e-15, err_msg=k)
    finally:
        m.set_threads(1)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_chunked_generic_pooling_path_matches_kernels(name):
    """Chunks with the gather + scatter-add pooling (CuPy's path) on NumPy: each chunk's key
    occurrences and offsets taken from the batch's."""
    m, b, _, inv, rows = _setup(name, seed=8, n=23)
    generic = _model(name, 2, (6, 5), seed=8)
    generic.load_state_dict(m.state_dict())
    generic.use_cpu_kernels, generic.chunk_rows = False, 4
    a, c = m.forward_backward(rows, inv, b), generic.forward_backward(rows, inv, b)
    assert a[0] == pytest.approx(c[0], rel=1e-12)
    for x, y in ((a[1], c[1]), (a[2], c[2]), *((a[3][k], c[3][k]) for k in a[3])):
        np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_results_are_bit_identical_on_any_thread_count_and_call_after_call(name):
    """float32, 1,000 examples in chunks of CHUNK_ROWS: 1 and 3 threads give the same bits; a second
    call with the scratch buffers in use gives the first call's bits; the first call's returned
    arrays are untouched by later calls (none is a scratch buffer)."""
    rng = np.random.default_rng(1)
    n = 4 * CHUNK_ROWS - 24
    b = ref.random_batch(rng, n, 3, n_dense=2, max_keys=3, vocab=50)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    m = _model(name, 2, (16, 8), seed=2, dtype=np.float32)
    rows = rng.normal(scale=0.5, size=(uniq.shape[0], m.row_params)).astype(np.float32)
    other = ref.random_batch(rng, n - 100, 3, n_dense=2, max_keys=3, vocab=50)
    _, o_inv = np.unique(other.keys, return_inverse=True)
    o_rows = rng.normal(size=(o_inv.max() + 1, m.row_params)).astype(np.float32)

    first = m.forward_backward(rows, inv, b)
    kept = _copy(first)
    m.forward_backward(o_rows, o_inv, other)             # reuses (and overwrites) the scratch buffers
    _assert_same(first, kept)
    _assert_same(m.forward_backward(rows, inv, b), kept)
    try:
        m.set_threads(3)
        _assert_same(m.forward_backward(rows, inv, b), kept)
        np.testing.assert_array_equal(m.predict(rows, inv, b), first[1])
    finally:
        m.set_threads(1)


def _copy(res):
    loss, probs, g_rows, g = res
    return loss, probs.copy(), g_rows.copy(), {k: v.copy() for k, v in g.items()}


def _assert_same(res, want):
    assert res[0] == want[0]
    np.testing.assert_array_equal(res[1], want[1])
    np.testing.assert_array_equal(res[2], want[2])
    for k in want[3]:
        np.testing.assert_array_equal(res[3][k], want[3][k], err_msg=k)


class _Float32Only(np.ndarray):
    """An array type whose every derived array must stay float32: a step that promotes raises."""

    def __array_finalize__(self, obj):
        if self.dtype.kind == "f" and self.dtype != np.float32:
            raise AssertionError(f"promoted to {self.dtype}")


class _CheckedNumpy:
    """NumPy, but the arrays it makes are ``_Float32Only`` (so are the arrays derived from them)."""

    MAKERS = ("empty", "zeros", "asarray", "where")

    def __getattr__(self, name):
        f = getattr(np, name)
        return (lambda *a, **k: f(*a, **k).view(_Float32Only)) if name in self.MAKERS else f


@pytest.mark.parametrize("name", sorted(MODELS))
def test_float32_throughout(name):
    """Every array the pass makes or derives from float32 inputs stays float32 (scalars, scratch
    buffers and the loss included), and so do the dense optimizers' steps."""
    from hps.model import DenseAdagrad, DenseAdam, DenseSGD

    rng = np.random.default_rng(3)
    b = ref.random_batch(rng, 300, 3, n_dense=2, max_keys=3, vocab=9)
    uniq, inv = np.unique(b.keys, return_inverse=True)
    m = _model(name, 2, (6, 5), seed=3, dtype=np.float32)
    m.xp = _CheckedNumpy()  # the kernels stay (chosen at construction)
    m.params = {k: v.view(_Float32Only) for k, v in m.params.items()}
    rows = rng.normal(scale=0.5, size=(uniq.shape[0], m.row_params)).astype(np.float32)
    loss, probs, g_rows, g = m.forward_backward(rows, inv, b)
    assert isinstance(probs, _Float32Only) and isinstance(g_rows, _Float32Only)
    assert all(isinstance(v, _Float32Only) for v in g.values())
    assert isinstance(m.predict(rows, inv, b), _Float32Only)
    with pytest.raises(AssertionError, match="promoted"):  # the check itself works
        g_rows * np.float64(2)
    for opt in (DenseAdam(1e-3), DenseAdagrad(0.1, 0.01), DenseSGD(0.1)):
        opt.step(m.params, g)
        opt.step(m.params, g)
        assert all(isinstance(v, _Float32Only) for v in m.params.values())


# -- layers with and without scratch buffers ---------------------------------------------------
def test_layers_give_the_same_bits_with_scratch_and_leave_their_inputs_alone():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(9, 6)).astype(np.float32)

    def params(layer):
        return {k: rng.normal(size=v).astype(np.float32) for k, v in layer.shapes().items()}

    mlp, cross, inter = L.MLP((6, 5, 4), relu_last=True), L.CrossNet(6, 2), L.DotInteraction(3)
    pm, pc = params(mlp), params(cross)
    t = x.reshape(9, 3, 2)
    dy = rng.normal(size=(9, 4)).astype(np.float32)
    runs = []
    for ws in (None, L.Scratch(np), L.Scratch(np)):
        out = []
        for _ in range(2):  # the second round reuses the buffers
            y, acts = mlp.forward(np, pm, x, ws)
            dy0, acts0 = dy.copy(), [a.copy() for a in acts]
            g = {}
            dx = mlp.backward(pm, acts, dy, g, ws=ws)
            np.testing.assert_array_equal(dy, dy0)
            for a, a0 in zip(acts, acts0):
                np.testing.assert_array_equal(a, a0)
            yc, ctx = cross.forward(np, pc, x, ws)
            gc = {}
            dxc = cross.backward(np, pc, ctx, dy0[:, :1] * x, gc, ws)
            d, _ = inter.forward(np, t, ws)
            dt = inter.backward(np, t, d * 0.5, ws)
            out.append([y.copy(), dx.copy(), dy0, {k: v.copy() for k, v in {**g, **gc}.items()},
                        yc.copy(), dxc.copy(), d.copy(), dt.copy()])
        runs.append(out[0])
        for a, c in zip(out[0], out[1]):
            _equal(a, c)
    for r in runs[1:]:
        for a, c in zip(runs[0], r):
            _equal(a, c)


def _equal(a, c):
    if isinstance(a, dict):
        for k in a:
            np.testing.assert_array_equal(a[k], c[k], err_msg=k)
    else:
        np.testing.assert_array_equal(a, c)


def test_scratch_reuses_one_buffer_per_name():
    ws = L.Scratch(np)
    a = ws.get("a", (8, 3), np.float32)
    assert ws.get("a", (5, 3), np.float32).base is a.base or np.shares_memory(ws.get("a", (5, 3), np.float32), a)
    assert ws.get("a", (5, 3), np.float32).flags.c_contiguous
    bigger = ws.get("a", (9, 3), np.float32)                 # more rows: a new buffer replaces it
    assert not np.shares_memory(bigger, a)
    assert not np.shares_memory(ws.get("a", (9, 4), np.float32), bigger)
    z = ws.get("z", (4, 2, 2), np.float32, zero=True)
    assert not z.any()
