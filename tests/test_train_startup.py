"""What every training process pays before its first example: a CPU job does not import numba-cuda or
the GPU kernels (``hps.gpu`` resolves its names on first use), so ranks of a CPU job do not each spend
~0.25 s and ~60 MB on them."""

import subprocess
import sys

GPU_MODULES = ("numba.cuda", "hps.gpu._train_ops", "hps.gpu._row_ops", "hps.gpu._partition_ops",
               "hps.train._device_backend")


def test_a_cpu_job_never_imports_the_gpu_kernels(tmp_path):
    code = ("import atexit, runpy, sys\n"
            f"atexit.register(lambda: print('LOADED', sorted(m for m in {GPU_MODULES!r} if m in sys.modules)))\n"
            "sys.argv = ['hps.train', '--rows', '3000', '--batch-size', '1024', '--minibatch-size', '256',\n"
            "            '--embedding-dim', '4', '--hidden', '8', '--no-progress']\n"
            "runpy.run_module('hps.train', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eval AUC" in proc.stdout
    assert "LOADED []" in proc.stdout, proc.stdout[-2000:]


def _child_says_ok(code: str) -> None:
    """Run ``code`` in a fresh interpreter; it must exit 0 and print OK."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_hps_gpu_still_exports_every_name():
    """Every name of ``hps.gpu.__all__`` resolves (the lazy table names each one's module)."""
    code = ("import hps.gpu as g\n"
            "missing = [n for n in g.__all__ if getattr(g, n, None) is None]\n"
            "assert not missing, missing\n"
            "assert sorted(dir(g)) == sorted(set(dir(g))) and set(g.__all__) <= set(dir(g))\n"
            "print('OK')\n")
    _child_says_ok(code)


def test_the_job_keeps_the_collector_off_what_lives_as_long_as_the_process():
    """``python -m hps.train`` freezes the modules and, after ``main``, what is left (``gc.freeze``), so
    neither the job's full collections nor interpreter shutdown trace them; the job's own garbage is
    still collected."""
    code = ("import atexit, gc, runpy, sys\n"
            "atexit.register(lambda: print('FROZEN', gc.get_freeze_count(), 'COLLECTED', sum(\n"
            "    s['collected'] for s in gc.get_stats())))\n"
            "sys.argv = ['hps.train', '--rows', '2000', '--batch-size', '512', '--minibatch-size', '256',\n"
            "            '--embedding-dim', '4', '--hidden', '8', '--no-progress']\n"
            "runpy.run_module('hps.train', run_name='__main__', alter_sys=True)\n")
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.split("FROZEN")[-1].split()
    frozen, collected = int(line[0]), int(line[2])
    assert frozen > 50_000, proc.stdout[-2000:]  # the imports alone leave more container objects
    assert collected > 0


def test_the_packages_import_nothing_heavy():
    """``import hps`` and ``import hps.train`` load neither NumPy nor Numba (their names resolve on first
    use): ``python -m hps.train``'s ``__main__`` runs once its packages are imported and imports the job's
    modules itself, with the garbage collector off."""
    code = ("import sys\n"
            "import hps, hps.train\n"
            "heavy = sorted(m for m in ('numpy', 'numba', 'hps.table', 'hps.train._trainer') if m in sys.modules)\n"
            "assert not heavy, heavy\n"
            "from hps import HashTable\n"
            "from hps.train import Trainer, main, run, load_export, OwnerSync\n"
            "assert set(hps.train.__all__) <= set(dir(hps.train))\n"
            "assert all(getattr(hps.train, n) is not None for n in hps.train.__all__)\n"
            "assert hps.mem.MemPS is hps.MemPS and hps.ssd.SSDStore is hps.SSDStore\n"   # subpackages resolve too
            "assert {'mem', 'gpu', 'HashTable'} <= set(dir(hps))\n"
            "print('OK')\n")
    _child_says_ok(code)
