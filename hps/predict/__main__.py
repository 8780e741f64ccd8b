"""``python -m hps.predict``: see ``hps.train._cli.predict_main``."""

import sys

from ..train._cli import predict_main

sys.exit(predict_main())
