"""``hps.cli``: the command lines' argument parsers, one style for all (``hps._argparse``: whole flags,
one-line errors), their output-path checks and their exit codes. The commands themselves run in
their packages (``hps.train._main``, ``hps.predict._main``, ``hps.profile._main``,
``hps.convert._main``), which import this package; it imports none of them.

- ``python -m hps.train``: :func:`build_train_parser`, :func:`parse_config` (flags and ``--config
  FILE.toml`` -> ``hps.config.Config``);
- ``python -m hps.predict``: :func:`build_predict_parser`;
- ``python -m hps.profile``: :func:`build_profile_parser`;
- ``python -m hps.convert``: :func:`build_convert_parser`.
"""

from ._convert import build_parser as build_convert_parser
from ._exit import EXIT_BAD_INPUT, EXIT_FAILED, fail, is_bad_input
from ._outputs import check_writable
from ._predict import build_predict_parser
from ._profile import build_parser as build_profile_parser
from ._train import build_parser as build_train_parser
from ._train import load_toml, parse_config

__all__ = ["build_train_parser", "build_predict_parser", "build_profile_parser", "build_convert_parser",
           "parse_config", "load_toml", "check_writable", "fail", "is_bad_input", "EXIT_BAD_INPUT", "EXIT_FAILED"]
