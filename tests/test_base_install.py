"""The base install (``pip install -e .``, no extras) runs every command a first user meets: the quick
start, training on a file with an export, scoring it, profiling. The extras' modules (mpi4py, CuPy,
numba-cuda) are made unimportable in the child process, as on a fresh machine; asking for something
that needs one is one line naming the extra to install. (.ci/run also runs the README's quick start in
a fresh venv with the base install only.)"""

import os
import subprocess
import sys

import numpy as np

#: Modules of the optional extras: ``None`` in ``sys.modules`` makes their import raise ImportError.
EXTRAS_MODULES = ("mpi4py", "cupy", "cupyx", "cupy_backends", "numba_cuda")
SMALL = ["--batch-size", "1024", "--minibatch-size", "256", "--embedding-dim", "4", "--hidden", "8",
         "--no-progress"]


def _without_extras(module, args, cwd, env=None):
    """``python -m module *args`` in a child process where the extras cannot be imported."""
    code = (f"import runpy, sys\n"
            f"for m in {EXTRAS_MODULES!r}: sys.modules[m] = None\n"
            f"sys.argv = [{module!r}, *{list(map(str, args))!r}]\n"
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, **(env or {})))


def _write_csv(path, n, seed):
    rng = np.random.default_rng(seed)
    site, app, price = rng.integers(0, 30, n), rng.integers(0, 10, n), rng.random(n)
    click = (rng.random(n) < 1 / (1 + np.exp(-(np.sin(site) + np.cos(app))))).astype(int)
    rows = "".join(f"{c},s{s},a{a},{p:.3f}\n" for c, s, a, p in zip(click, site, app, price))
    path.write_text("click,site,app,price\n" + rows)


def test_the_quick_start_trains_without_the_extras(tmp_path):
    proc = _without_extras("hps.train", ["--rows", "6000", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eval AUC" in proc.stdout and "Traceback" not in proc.stderr


def test_train_on_a_file_export_predict_and_profile_without_the_extras(tmp_path):
    _write_csv(tmp_path / "train.csv", 3000, 0)
    _write_csv(tmp_path / "eval.csv", 1000, 1)
    train = _without_extras("hps.train", ["--format", "csv", "--data", "train.csv", "--eval-data", "eval.csv",
                                          "--dense-columns", "price", "--export", "model", *SMALL], tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    pred = _without_extras("hps.predict", ["--model-dir", "model", "--data", "eval.csv", "--out", "p.csv"], tmp_path)
    assert pred.returncode == 0, pred.stderr[-3000:]
    assert "scored 1000 examples" in pred.stdout and (tmp_path / "p.csv").exists()
    prof = _without_extras("hps.profile", ["--rows", "4000", "--hot-bytes", "64k", "--out", "prof.h5"], tmp_path)
    assert prof.returncode == 0, prof.stderr[-3000:]
    assert (tmp_path / "prof.h5").exists()


def test_what_needs_an_extra_names_it_in_one_line(tmp_path):
    """Launched as rank 0 of 2 (what mpiexec sets) without mpi4py; --device cuda without CuPy."""
    mpi = _without_extras("hps.train", ["--rows", "2000", *SMALL], tmp_path, env={"PMI_SIZE": "2", "PMI_RANK": "0"})
    assert mpi.returncode == 1
    assert mpi.stderr.strip().splitlines() == [
        "hps: error: MPI needs mpi4py, which cannot be imported (import of mpi4py halted; None in sys.modules): "
        'pip install -e ".[mpi]"']
    gpu = _without_extras("hps.train", ["--rows", "2000", "--device", "cuda", *SMALL], tmp_path,
                          env={"NUMBA_ENABLE_CUDASIM": "0"})
    assert gpu.returncode == 1
    assert gpu.stderr.strip().splitlines() == ['hps: error: --device cuda needs CuPy: pip install -e ".[gpu]"']
