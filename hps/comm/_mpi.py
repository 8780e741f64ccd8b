"""mpi4py, imported when MPI is first used: the base install (``pip install -e .``) has no mpi4py, and a
one-process job never touches MPI, so importing hps must not need it.

``MPI`` stands for ``mpi4py.MPI``: its first attribute access imports mpi4py (which initialises MPI)
and every later one is a plain lookup on the module. Without mpi4py that access raises
:class:`hps.errors.CommError` saying which extra to install, instead of a ``ModuleNotFoundError``
from deep inside an import chain.
"""

from __future__ import annotations

import numpy as np

from .._extras import install_hint
from ..errors import CommError


def load_mpi():
    """``mpi4py.MPI``; raises CommError naming the ``mpi`` extra when mpi4py cannot be imported."""
    try:
        from mpi4py import MPI as mpi
    except ImportError as e:
        raise CommError(f"MPI needs mpi4py, which cannot be imported ({e}): {install_hint('mpi')}") from None
    return mpi


class _LazyMPI:
    """``mpi4py.MPI``, imported on the first attribute access (see the module docstring)."""

    __slots__ = ()

    def __getattr__(self, name):
        return getattr(load_mpi(), name)

    def __repr__(self) -> str:
        return "<mpi4py.MPI, imported on first use>"


MPI = _LazyMPI()


_TYPES: dict = {}


def mpi_type(dtype):
    """The MPI datatype of NumPy ``dtype`` (looked up once per dtype: the lookup cost ~30 µs a call, on
    every call of a mini-batch's exchanges)."""
    char = np.dtype(dtype).char
    t = _TYPES.get(char)
    if t is None:
        t = _TYPES[char] = MPI.Datatype.fromcode(char)
    return t
