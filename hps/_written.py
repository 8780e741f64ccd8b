"""``written_whole(path)``: write a file beside ``path`` and rename it over ``path`` only when whole."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def written_whole(path):
    """A temporary path beside ``path`` (same directory: the rename is atomic) for the block to write;
    renamed over ``path`` when the block ends, removed when it raises. So ``path`` holds its old content
    or the whole new one, never a half-written file (an output of a run that failed)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.hps-tmp-{os.getpid()}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # ours; gone already when the rename made it ``path``
