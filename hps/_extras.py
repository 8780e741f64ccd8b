"""The optional parts of hps (``extras_require`` in setup.py) and the one way a message names them.

The base install (``pip install -e .``) trains on the CPU in one process; ``gpu`` (CuPy, numba-cuda),
``mpi`` (mpi4py, the pip MPICH and its mpiexec) and ``plots`` (matplotlib) are imported only by the
code that needs them, which says how to install them when they are missing.
"""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """The command that installs ``extra`` into a checkout of hps (hps is installed from its source
    tree, so ``pip install hps[...]`` would fetch an unrelated package)."""
    return f'pip install -e ".[{extra}]"'
