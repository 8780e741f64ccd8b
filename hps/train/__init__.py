"""``hps.train``: the training job (``python -m hps.train``) and its library entry points.

Besides the job (``run``, ``Trainer``), the parameter hierarchy and the train step compose without a
``Config`` (``tests/test_train_library.py``): the tiers' residency (``ParameterHierarchy``), the train
step's CPU backend (``HostBackend``; ``--device cuda``'s is built by ``Trainer``), the sparse sync
strategies (``OwnerSync``, ``ReplicaSync``), the dense one (``DenseSync``), and ``Feature``, the hooks
through which a feature plugs into the trainer's pipeline.
"""

#: Where each public name lives: imported on first access (PEP 562), so that ``python -m hps.train``
#: runs its ``__main__`` before the job's modules load (it keeps them out of the garbage collector's
#: reach; see ``hps/train/__main__.py``).
_LAZY = {"main": "._main", "run": "._run", "Trainer": "._trainer", "load_export": "..formats",
         "ParameterHierarchy": "._hierarchy", "HostBackend": "._backend", "OwnerSync": "._sync",
         "ReplicaSync": "._sync", "DenseSync": "._dense_sync", "Feature": "._features"}

__all__ = ["main", "run", "Trainer", "load_export", "ParameterHierarchy", "HostBackend", "OwnerSync", "ReplicaSync",
           "DenseSync", "Feature"]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
