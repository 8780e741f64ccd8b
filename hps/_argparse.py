"""The argument parser of every hps command line (``python -m hps.train``, ``hps.predict``,
``hps.profile`` and the ``bench`` scripts): argparse without its two surprises for a first user.

- **No abbreviations.** argparse takes ``--epoch 3`` for ``--epochs 3`` and ``--ignore-column`` for
  ``--ignore-columns``; a flag that later gains a sibling with the same prefix silently changes meaning.
  Every flag must be written whole.
- **An error is one line.** An unknown flag names the closest real one (difflib); any other argparse
  error (a bad value, a missing flag) is its message alone, not the whole usage text before it. Exit
  code 2, as argparse's.

``comma_names(text)``: a comma-separated flag value (``--dense-columns hour,cnt``) as a tuple of names.
"""

from __future__ import annotations

import argparse
import difflib


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with ``allow_abbrev=False`` and one-line errors (module docstring).

    ``error_prefix`` starts every error line (``hps: error: …``), as the command's other errors do.
    """

    def __init__(self, *args, error_prefix: str = "hps", **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self.error_prefix = error_prefix

    def parse_args(self, args=None, namespace=None):
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(self.unknown_message(extras))
        return namespace

    def unknown_message(self, extras) -> str:
        """``unknown flag --epoch (did you mean --epochs?)`` for the unknown arguments ``extras``."""
        known = [s for action in self._actions for s in action.option_strings]
        flags = [arg.split("=", 1)[0] for arg in extras if arg.startswith("-")]
        if not flags:  # only stray values; with flags, the values are theirs: name the flags
            return f"unexpected argument {extras[0]!r}; {self.prog} --help lists the flags"
        parts = []
        for flag in flags:
            close = _closest(flag, known)
            parts.append(f"unknown flag {flag}" + (f" (did you mean {close}?)" if close else ""))
        return f"{'; '.join(parts)}; {self.prog} --help lists the flags"

    def error(self, message):
        """Print ``<prefix>: error: <message>`` (one line) to stderr and exit 2."""
        self.exit(2, f"{self.error_prefix}: error: {message}\n")


def _closest(flag: str, known: list[str]) -> str | None:
    """The flag of ``known`` a user most likely meant by ``flag``: the one it abbreviates (the most
    similar one, if it abbreviates several), else the most similar one (difflib), else None."""
    extended = [k for k in known if k.startswith(flag)]
    close = difflib.get_close_matches(flag, extended or known, n=1, cutoff=0.0 if extended else 0.6)
    return close[0] if close else None


def comma_names(text) -> tuple:
    """The names of a comma-separated flag value, blanks dropped (``"a, b,"`` -> ``("a", "b")``;
    empty or None -> ``()``)."""
    return tuple(c.strip() for c in text.split(",") if c.strip()) if text else ()
