"""mpi4py, imported when MPI is first used: the base install (``pip install -e .``) has no mpi4py, and a
one-process job never touches MPI, so importing hps must not need it.

``MPI`` stands for ``mpi4py.MPI``: its first attribute access imports mpi4py (which initialises MPI)
and every later one is a plain lookup on the module. Without mpi4py that access raises
:class:`hps.errors.CommError` saying which extra to install, instead of a ``ModuleNotFoundError``
from deep inside an import chain.
"""

from __future__ import annotations

import os

import numpy as np

from .._extras import install_hint
from ..errors import CommError


#: MPICH settings a job asks for (``ask_mpich_settings``): messages up to 64 KiB between two ranks of a node
#: go eagerly through 68 KiB shared-memory cells (64 cells a rank: 4.25 MiB) instead of the single-copy
#: (CMA) rendezvous from 8 KiB up, whose three steps each wait for the other rank's next MPI call; a
#: mini-batch's row and gradient messages (tens of KiB per peer) then cost the receiver one call. Measured
#: with 4 and 8 ranks on 2 cores (docs/training.md, "Threads and MPI"). MPICH checks that the pack buffer
#: holds a cell, so the three go together. Other MPIs ignore them.
MPICH_SETTINGS = {"MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_CELL_SIZE": "69632",
                  "MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD": "65536",
                  "MPIR_CVAR_CH4_PACK_BUFFER_SIZE": "69632"}


def ask_mpich_settings(environ=os.environ) -> bool:
    """Put :data:`MPICH_SETTINGS` into ``environ`` unless it sets any of them (the user's choice wins,
    whole: MPICH aborts on a cell larger than its pack buffer) -> whether they were put. Takes effect
    only before MPI is initialised (the first use of :data:`MPI`): for the process that runs a job
    (``python -m hps.train``), not for a library caller who initialised MPI."""
    if any(k in environ for k in MPICH_SETTINGS):
        return False
    environ.update(MPICH_SETTINGS)
    return True


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
