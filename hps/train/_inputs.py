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

A resumed job must read the example stream of the job that wrote its checkpoint, or it continues from
batch N of other data. So a checkpoint records the stream (:func:`stream_record`: the files described
as above, the format and its options, the shards and how they are cut, the batch and mini-batch
sizes, the shuffle and the seed), and ``--resume`` refuses a checkpoint whose stream differs from the
run's (:func:`check_resumed_stream`), before anything is loaded, naming each difference.
"""

from __future__ import annotations

import json
import os

from ..data import HASHING_VERSION
from ..data._shards import SHARD_CUT
from ..errors import HpsError, InvalidInputError
from ..ssd._format import crc32
from ._records import data_files

#: What each entry of a stream record is called to a user (the flags behind it).
_STREAM_NAMES = {"format": "--format", "options": "the format's options", "files": "--data",
                 "shards": "the data shards (--data-shards, or one per rank)",
                 "shard_cut": "how files are cut into shards",
                 "batch_size": "--batch-size", "minibatch_size": "--minibatch-size",
                 "shuffle_buffer": "--shuffle-buffer", "seed": "--seed", "op_osrp": "--op-osrp",
                 "hashing": "the hashing of keys"}

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


def stream_record(cfg, feed) -> dict:
    """The example stream of a job reading ``feed`` under ``cfg`` (the module docstring), JSON as a
    checkpoint stores it: the files by position (size and edge CRC-32, not their paths). Blocks (two
    small reads per file)."""
    d, tc = cfg.data, cfg.train
    options = {k: v for k, v in feed.format_options.items() if k != "dense_stats"}  # stats: from the files
    files = [[size, crc] for _, size, crc in describe(data_files(d.data))] if d.format != "synthetic" else []
    record = {"format": d.format, "options": options, "files": files, "shards": feed.n_shards,
              "shard_cut": SHARD_CUT, "batch_size": tc.batch_size, "minibatch_size": tc.minibatch_size,
              "shuffle_buffer": tc.shuffle_buffer, "seed": tc.seed, "op_osrp": d.op_osrp, "hashing": HASHING_VERSION}
    return json.loads(json.dumps(record))


def check_resumed_stream(recorded: dict | None, mine: dict, where: str, log) -> None:
    """Raise InvalidInputError naming every entry of ``mine`` (this run's :func:`stream_record`) that
    differs from ``recorded`` (the checkpoint at ``where``'s). A checkpoint of an older hps records no
    stream (``None``): a warning to ``log(line)`` says it resumes unchecked. Entries only one side has are not
    compared (a newer record's). Gives the same answer on every rank (the ranks' files are the same)."""
    if recorded is None:
        log(f"hps: warning: {where} was written by an hps that did not record its input: resuming unchecked; give the "
             "command that wrote it (such checkpoints, before 2026-11-27, cut plain files into shards by "
             "equal byte lengths: resume them with the hps that wrote them)")
        return
    differ = [f"{_STREAM_NAMES.get(k, k)}: {_short(k, recorded[k])} there, {_short(k, v)} now"
              for k, v in mine.items() if k in recorded and recorded[k] != v]
    if differ:
        raise InvalidInputError(f"{where} was trained on another example stream ({'; '.join(differ)}): resume "
                                "with the command that wrote it plus --resume (the same data, batch sizes, "
                                "shards and seed), or train from scratch without --resume")


def _short(key: str, value) -> str:
    if key == "files":
        return f"{len(value)} file(s) of {sum(size for size, _ in value):,} bytes (CRC-32 of their ends " \
               f"{', '.join(f'{crc:08x}' for _, crc in value[:3])}{', ...' if len(value) > 3 else ''})"
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
