import pytest


@pytest.fixture(scope="module", autouse=True)
def small_launches():
    """Every simulated launch (the one helper, ``hps._launch``) uses 16-thread blocks and at most 3
    blocks, so tiny batches span several blocks and every grid-stride loop runs several rounds."""
    from hps import _launch

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_launch, "BLOCK_SIZE", 16)
        mp.setattr(_launch, "SIM_MAX_BLOCKS", 3)
        yield


@pytest.fixture
def no_warm_up(monkeypatch):
    """Jobs started in this process skip the kernel warm-up (``hps/train/_warmup.py``: a scratch job
    of eight tiny batches, seconds of simulated kernels before each job) for tests whose point is
    elsewhere. The warm-up on ``--device cuda`` stays covered: every model and row-optimizer case of
    ``test_train_device_cuda_cudasim.py``, the feature jobs and every job under ``mpiexec`` keep it."""
    from hps.train import _warmup

    monkeypatch.setattr(_warmup, "warm_up", lambda trainer, log: 0.0)
