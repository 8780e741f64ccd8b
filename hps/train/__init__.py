"""``hps.train``: the training job (``python -m hps.train``) and its library entry points.

Besides the job (``run``, ``Trainer``), the parameter hierarchy and the train step compose without a
``Config`` (``tests/test_train_library.py``): the tiers' residency (``ParameterHierarchy``), the train
step's CPU backend (``HostBackend``; ``--device cuda``'s is built by ``Trainer``), the sparse sync
strategies (``OwnerSync``, ``ReplicaSync``), the dense one (``DenseSync``), and ``Feature``, the hooks
through which a feature plugs into the trainer's pipeline.
"""

from ._backend import HostBackend
from ..formats import load_export
from ._main import main
from ._dense_sync import DenseSync
from ._features import Feature
from ._hierarchy import ParameterHierarchy
from ._run import run
from ._sync import OwnerSync, ReplicaSync
from ._trainer import Trainer

__all__ = ["main", "run", "Trainer", "load_export", "ParameterHierarchy", "HostBackend", "OwnerSync", "ReplicaSync",
           "DenseSync", "Feature"]
