"""``EnvMode``: a process-wide choice among named modes, read once from an environment variable and
switchable later (``HPS_CUDA_LAUNCH`` of ``hps._driver_launch``, ``HPS_CUDA_GEMM`` of ``hps._cublas``,
``HPS_CUDA_LAYERS`` of ``hps.model._layers``), or read at each use (``HPS_DENSE_STEP`` of
``hps.model._dense_optim``, ``HPS_CUDA_GRAPHS`` of ``hps.model._graphs``: :meth:`EnvMode.read`)."""

from __future__ import annotations

import os

from .errors import InvalidInputError


class EnvMode:
    """One of ``modes``: the value of the environment variable ``var`` when first asked for (``default``
    when unset), or what :meth:`set` chose since. ``what`` names the choice in errors."""

    __slots__ = ("var", "modes", "default", "what", "_mode")

    def __init__(self, var: str, modes: tuple, default: str, what: str):
        self.var, self.modes, self.default, self.what = var, tuple(modes), default, what
        self._mode = None

    def get(self) -> str:
        m = self._mode
        return m if m is not None else self.set(os.environ.get(self.var, self.default))

    def read(self) -> str:
        """The variable's value now (``default`` when unset), checked, neither cached nor chosen: for a
        switch its users read where they use it (a process may change it between jobs)."""
        return self._check(os.environ.get(self.var, self.default))

    def _check(self, m: str) -> str:
        if m not in self.modes:
            raise InvalidInputError(f"{self.var} / {self.what} must be one of {', '.join(self.modes)}, got {m!r}")
        return m

    def set(self, m: str) -> str:
        """Choose ``m`` (one of the modes) from now on; returns it."""
        self._mode = self._check(m)
        return m
