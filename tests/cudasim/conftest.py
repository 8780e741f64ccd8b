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
