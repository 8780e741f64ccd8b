"""Running ``python -m hps.train`` as a child job from the end-to-end benchmarks (under ``mpiexec``
for more than one rank)."""

import json
import os
import subprocess
import sys
from pathlib import Path

#: one BLAS/OpenMP thread per rank: ranks share the machine's cores
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def train_command(args: list[str], metrics: Path, ranks: int = 1) -> list[str]:
    """The command line of a training job writing its metrics to ``metrics``: ``mpiexec -n ranks``
    (the venv's own, else the one on PATH) around it for more than one rank."""
    cmd = [sys.executable, "-m", "hps.train", "--no-progress", "--metrics-out", str(metrics), *args]
    if ranks > 1:
        mpiexec = Path(sys.executable).parent / "mpiexec"
        cmd = [str(mpiexec if mpiexec.exists() else "mpiexec"), "-n", str(ranks), *cmd]
    return cmd


def write_result(out, module: str, argv, payload: dict) -> None:
    """Write ``payload`` as JSON to ``out`` (its folder made), led by the ``command`` that reproduces
    it: ``python -m bench.<module>`` with ``argv`` (default: this process's arguments)."""
    args = argv if argv is not None else sys.argv[1:]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps({"command": " ".join([f"python -m bench.{module}", *args]), **payload},
                                    indent=1, default=float))


def train_job(args: list[str], metrics: Path, ranks: int = 1, single_threaded: bool = False) -> dict:
    """Run a training job to the end -> its metrics; SystemExit with its stderr's tail if it fails."""
    cmd = train_command(args, metrics, ranks)
    env = dict(os.environ, **SINGLE_THREADED) if single_threaded else None
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"job failed ({' '.join(cmd)}):\n{proc.stderr[-4000:]}")
    return json.loads(Path(metrics).read_text())
