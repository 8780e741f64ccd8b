"""The ranks of a job agree on their input before they read it.

Every rank reads only its own shards, and cuts the data into line-aligned byte ranges (or whole
files) from the files' sizes (``hps.data._shards``). Ranks that see different copies of ``--data``
(a node with a partial copy, an older download) would cut different ranges and skip or repeat
examples without any error. So at start every rank describes its ``--data`` and ``--eval-data``:
the files in reading order, with the size of each and a CRC-32 of its first and last
``EDGE_BYTES``; the ranks exchange the descriptions (one allgather) and every rank compares them
with rank 0's. A difference is one InvalidInputError, raised on every rank (none waits for
another), naming the rank, the file and what differs.

Paths may differ between ranks (each node may hold its copy elsewhere): the files are compared by
position. Cost: two small reads per file and rank, once per job.
"""

from __future__ import annotations

import os

from ..errors import HpsError, InvalidInputError
from ..ssd._format import crc32
from ._records import data_files

#: Bytes read at each end of a data file for its checksum.
EDGE_BYTES = 64 << 10


def describe(paths) -> list[tuple[str, int, int]]:
    """``(path, size in bytes, CRC-32 of the first and the last EDGE_BYTES)`` of each file. Blocks."""
    out = []
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(min(size, EDGE_BYTES))
            f.seek(max(size - EDGE_BYTES, 0))
            crc = crc32(f.read(EDGE_BYTES), crc32(head))
        out.append((str(p), int(size), int(crc)))
    return out


def _mine(cfg) -> tuple[dict, Exception | None]:
    """This rank's description of ``--data`` and ``--eval-data`` (an error message for a flag whose
    files it cannot read), and the first such error."""
    out, error = {}, None
    for flag, value in (("--data", cfg.data.data), ("--eval-data", cfg.data.eval_data)):
        try:
            out[flag] = describe(data_files(value))
        except (HpsError, OSError) as e:
            out[flag] = f"{type(e).__name__}: {e}"
            error = error or e
    return out, error


def check_same_inputs(ch, cfg) -> None:
    """Raise InvalidInputError on every rank unless every rank's ``--data`` and ``--eval-data`` are
    the same files as rank 0's (see the module docstring); a rank that cannot read its files raises
    its own error (a missing file: DataFileNotFoundError), the others say which rank. Collective
    over the channel ``ch``; a no-op for one rank and for synthetic data."""
    if ch.size < 2 or cfg.data.format == "synthetic":
        return
    mine, error = _mine(cfg)
    every = ch.allgather(mine)
    if error is not None:
        raise error
    for flag in ("--data", "--eval-data"):
        problem = _compare(flag, [r[flag] for r in every])
        if problem:
            raise InvalidInputError(f"the ranks read different {flag}: {problem}; give every rank the same files")


def _compare(flag: str, ranks: list) -> str | None:
    """The first difference between rank 0's description and another rank's, in words, or None."""
    for r, mine in enumerate(ranks):
        if isinstance(mine, str):
            return f"rank {r} cannot read its {flag} ({mine})"
    ref = ranks[0]
    for r, mine in enumerate(ranks[1:], start=1):
        if len(mine) != len(ref):
            return f"rank {r} has {len(mine)} files, rank 0 {len(ref)}"
        for i, ((path, size, crc), (path0, size0, crc0)) in enumerate(zip(mine, ref)):
            which = f"file {i + 1} of {len(ref)}, {path} on rank {r} ({path0} on rank 0)"
            if size != size0:
                return f"{which} has {size:,} bytes on rank {r}, {size0:,} on rank 0"
            if crc != crc0:
                return f"{which} holds other bytes at its start or end on rank {r} than on rank 0"
    return None
