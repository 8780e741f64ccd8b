"""``hps.predict``: score raw data with an exported model.

Library: ``hps.Predictor(EXPORT_DIR)`` (:class:`Predictor`); command line: ``python -m hps.predict
--model-dir EXPORT_DIR --data FILE … --out preds.csv`` (``hps.predict._main``, its parser in ``hps.cli``). The model
directory may also be a checkpoint or a ``--checkpoint-dir`` (``hps.formats.read_model``).
"""

from ._predictor import DEFAULT_BATCH, UNKNOWN_KEYS, Predictor

__all__ = ["Predictor", "UNKNOWN_KEYS", "DEFAULT_BATCH"]
