"""On a real GPU the warm-up leaves nothing to compile to the timed training (``hps.train._warmup``): no
new Numba CUDA specialisation and no CuPy kernel (CuPy compiles some per size class, which the tiny
scratch batches never reach: the full-size scratch batch does). The host twin is
``tests/test_warmup.py``."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu

# In a fresh process with an empty CuPy kernel cache: warm up, then count what the timed part adds.
SCRIPT = textwrap.dedent("""
    import json, os, sys
    from numba.cuda.dispatcher import CUDADispatcher
    from hps.config import Config
    from hps.train import Trainer, _warmup

    def specialisations():
        return {f"{name}.{k}": len(v.overloads) for name, mod in list(sys.modules.items())
                if name.startswith("hps") and mod is not None
                for k, v in vars(mod).items() if isinstance(v, CUDADispatcher)}

    def cupy_kernels():
        return sum(len(files) for _, _, files in os.walk(os.environ["CUPY_CACHE_DIR"]))

    t = Trainer(Config.from_flat(json.loads(sys.argv[1])))
    try:
        _warmup.warm_up(t, print)
        before, cupy_before = specialisations(), cupy_kernels()
        t.fit(warm_up=False)
        after, cupy_after = specialisations(), cupy_kernels()
    finally:
        t.close()
    new = {k: [before.get(k, 0), n] for k, n in after.items() if n != before.get(k, 0)}
    print(json.dumps({"new": new, "cupy": [cupy_before, cupy_after]}))
""")


def test_the_timed_cuda_training_compiles_nothing(tmp_path):
    pytest.importorskip("cupy")
    flat = dict(rows=5 * 4096, fields=8, vocab_per_field=5000, batch_size=4096, minibatch_size=1024,
                hidden=[64, 32], embedding_dim=16, device="cuda", sparse_optimizer="adam", progress=False)
    env = dict(os.environ, CUPY_CACHE_DIR=str(tmp_path / "cupy"))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(flat)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["new"] == {}                               # kernel -> [specialisations before, after]
    assert out["cupy"][0] > 0 and out["cupy"][1] == out["cupy"][0]  # CuPy kernels: compiled before, none after
