"""``python -m hps.convert``: see ``hps.convert._cli``."""

import sys

from ._cli import main

sys.exit(main())
