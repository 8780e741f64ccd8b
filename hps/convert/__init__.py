"""``hps.convert``: any input hps reads, written once as Parquet with the keys already hashed.

Command line: ``python -m hps.convert --format F --data PATHS --out DIR [the reader's options]
[--rows-per-file N]``; then ``python -m hps.train --format parquet --data DIR …`` trains exactly as
from the source, reading without parsing or hashing (``hps.data._converted``: the layout, the
checks). Library: :func:`convert`.
"""

from ._write import COMPRESSIONS, DEFAULT_MAX_SHARDS, convert

__all__ = ["convert", "COMPRESSIONS", "DEFAULT_MAX_SHARDS"]
