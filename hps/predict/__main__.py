"""``python -m hps.predict``: see ``hps.predict._main.predict_main``."""

import sys

from ._main import predict_main

sys.exit(predict_main())
