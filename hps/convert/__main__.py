"""``python -m hps.convert``: see ``hps.convert._main``."""

import sys

from ._main import main

sys.exit(main())
