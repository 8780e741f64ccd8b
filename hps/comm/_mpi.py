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


#: MPICH settings a job asks for (``ask_mpich_settings``): messages up to 512 KiB between two ranks of a node
#: go eagerly through 516 KiB shared-memory cells (8 cells a rank: 4.03 MiB of ``/dev/shm``, what MPICH's
#: default 64 cells of 16 KiB and the 64 of 68 KiB this asked for before took) instead of the single-copy
#: (CMA) rendezvous, whose three steps each wait for the other rank's next MPI call: a rank that sleeps
#: between its tests (``_wait``) would hold up every peer sending to it. A mini-batch's fused messages
#: (``BlockExchange``: a 143 KB dense block at 4 ranks of the MLP 256-128 plus tens to hundreds of KiB
#: of rows a peer) then cost the receiver one call and the sender none. Measured with 4 ranks on 2 cores
#: (docs/benchmarks.md, section "Scaling"). MPICH checks that the pack buffer holds a cell, so they go
#: together. MPICH reads them; other MPIs (Open MPI among them) have no ``MPIR_CVAR_`` settings; whether
#: MPICH derivatives (Intel MPI, Cray MPICH, MVAPICH) honour them is untested.
MPICH_SETTINGS = {"MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_CELL_SIZE": "528384",
                  "MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_NUM_CELLS": "8",
                  "MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD": "524288",
                  "MPIR_CVAR_CH4_PACK_BUFFER_SIZE": "528384"}
#: The spellings under which MPICH reads a setting ``MPIR_CVAR_<NAME>`` (the ``MPIR_CVAR_`` one wins).
MPICH_SETTING_PREFIXES = ("MPIR_CVAR_", "MPICH_", "MPIR_PARAM_")
#: Where launchers put the number of ranks on this node before ``MPI_Init`` (MPICH's hydra, Open MPI).
LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")


def cpu_set() -> frozenset[int]:
    """The CPUs this process may run on (its affinity; every CPU where the OS cannot say)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def node_cores() -> int:
    """Cores this process may run on."""
    return len(cpu_set())


def launched_ranks_on_node(environ=os.environ) -> int | None:
    """Ranks on this node as the launcher says (:data:`LOCAL_SIZE_VARS`, readable before ``MPI_Init``);
    None when no launcher said."""
    for v in LOCAL_SIZE_VARS:
        try:
            return int(environ[v])
        except (KeyError, ValueError):
            continue
    return None


def _spellings(name: str) -> tuple[str, ...]:
    base = name.removeprefix("MPIR_CVAR_")
    return tuple(p + base for p in MPICH_SETTING_PREFIXES)


def ask_mpich_settings(environ=os.environ, cores: int | None = None) -> bool:
    """Put :data:`MPICH_SETTINGS` into ``environ`` when the ranks on this node (the launcher's count,
    :func:`launched_ranks_on_node`) outnumber its ``cores`` (default :func:`node_cores`), the case they
    were measured in, and ``environ`` sets none of them under any spelling MPICH reads
    (:data:`MPICH_SETTING_PREFIXES`; the user's choice wins, whole: MPICH aborts on a cell larger than its
    pack buffer) -> whether they were put. Not asked otherwise: each rank's cells take 4.03 MiB of
    ``/dev/shm``, which a small one (Docker's 64 MiB default) cannot give many ranks.

    The settings stay in the process's environment: child processes inherit them. Takes effect only
    before MPI is initialised (the first use of :data:`MPI`): for the process that runs a job
    (``python -m hps.train``), not for a library caller who initialised MPI."""
    local = launched_ranks_on_node(environ)
    if local is None or local <= (node_cores() if cores is None else cores):
        return False
    if any(s in environ for k in MPICH_SETTINGS for s in _spellings(k)):
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
