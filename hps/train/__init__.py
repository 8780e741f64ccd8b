"""``hps.train``: the training job (``python -m hps.train``) and its library entry points."""

from ._export import load_export
from ._cli import main
from ._run import run
from ._trainer import Trainer

__all__ = ["main", "run", "Trainer", "load_export"]
