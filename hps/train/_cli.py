"""``python -m hps.train``: the command line. The only module that parses arguments.

Every flag can also be given as a key of ``--config FILE.toml`` (same names, dashes or underscores;
flags on the command line win). Errors become one line on stderr and exit code 2 (bad input) or 1.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..config import DENSE_OPTIMIZERS, DEVICES, FORMATS, MPI_WAITS, SPARSE_OPTIMIZERS, SPARSE_SYNCS, Config
from ..errors import HpsError, InvalidInputError

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hps.train",
        description="Train a CTR model over the HBM/DRAM/SSD parameter hierarchy. With no arguments: "
                    "synthetic data on the CPU, in about a minute.")
    S = argparse.SUPPRESS  # unset flags stay absent, so TOML values and dataclass defaults apply
    g = p.add_argument_group("data")
    g.add_argument("--config", help="TOML file with any of these options as keys")
    g.add_argument("--format", choices=FORMATS, default=S, help="data format (default synthetic)")
    g.add_argument("--data", default=S, help="training data file")
    g.add_argument("--eval-data", default=S, help="evaluation data file (synthetic: built-in split)")
    g.add_argument("--rows", type=int, default=S, help="synthetic: training examples (200000)")
    g.add_argument("--fields", type=int, default=S, help="synthetic: categorical fields (8)")
    g.add_argument("--vocab-per-field", type=int, default=S, help="synthetic: values per field (20000)")
    g.add_argument("--zipf", type=float, default=S, help="synthetic: Zipf exponent (1.1)")
    g.add_argument("--n-dense", type=int, default=S, help="synthetic: dense features (4)")
    g.add_argument("--label-column", default=S, help="csv: label column (click)")
    g.add_argument("--libsvm-fields", type=int, default=S, help="libsvm: positional fields")
    g.add_argument("--strict", action="store_true", default=S, help="stop at the first malformed line")
    g.add_argument("--data-shards", type=int, default=S,
                   help="shards the data is cut into, read K/N per rank; one process with K shards "
                        "trains exactly like K ranks (default: the number of ranks)")
    g = p.add_argument_group("model")
    g.add_argument("--embedding-dim", type=int, default=S, help="embedding width (16)")
    g.add_argument("--hidden", default=S, help="MLP hidden sizes, comma separated (128,64)")
    g.add_argument("--sparse-optimizer", choices=SPARSE_OPTIMIZERS, default=S, help="(adagrad)")
    g.add_argument("--dense-optimizer", choices=DENSE_OPTIMIZERS, default=S, help="(adam)")
    g.add_argument("--lr", type=float, default=S, help="embedding learning rate (0.2)")
    g.add_argument("--dense-lr", type=float, default=S, help="MLP learning rate (0.001)")
    g.add_argument("--adagrad-init", type=float, default=S, help="Adagrad initial accumulator (0.001)")
    g = p.add_argument_group("tiers")
    g.add_argument("--device", choices=DEVICES, default=S, help="HBM-PS and model device (cpu)")
    g.add_argument("--mem-budget", default=S, help="MEM-PS DRAM budget, e.g. 512MB (256MB)")
    g.add_argument("--ssd-path", default=S, help="SSD-PS directory (a temporary one)")
    g.add_argument("--rows-per-file", type=int, default=S, help="SSD-PS rows per file (16384)")
    g.add_argument("--hbm-capacity", type=int, default=S, help="HBM-PS keys (sized from batch 1)")
    g.add_argument("--n-parts", type=int, default=S, help="HBM-PS parts / GPUs per process (1)")
    g = p.add_argument_group("training")
    g.add_argument("--batch-size", type=int, default=S, help="examples per batch, whole job (16384)")
    g.add_argument("--minibatch-size", type=int, default=S, help="examples per update, whole job (1024)")
    g.add_argument("--epochs", type=int, default=S, help="(1)")
    g.add_argument("--seed", type=int, default=S, help="(0)")
    g.add_argument("--queue-depth", type=int, default=S, help="items between pipeline stages (1)")
    g.add_argument("--checkpoint-dir", default=S, help="write checkpoints here")
    g.add_argument("--checkpoint-every", type=int, default=S, help="batches between checkpoints (0: per epoch)")
    g.add_argument("--resume", action="store_true", default=S, help="continue from --checkpoint-dir")
    g.add_argument("--export", default=S, help="write the trained model as HDF5 into this directory")
    g.add_argument("--metrics-out", default=S, help="write metrics as JSON to this file")
    g.add_argument("--plots", default=S, help="draw figures (PNG) into this directory (matplotlib)")
    g.add_argument("--ranks-per-node", type=int, default=S, help="MPI: ranks per node (auto)")
    g.add_argument("--sparse-sync", choices=SPARSE_SYNCS, default=S,
                   help="MPI: owner = each row lives at its owner rank, which serves it and applies its "
                        "summed gradient; allreduce = every rank holds the batch's rows (Appendix C.3) (owner)")
    g.add_argument("--mpi-wait", choices=MPI_WAITS, default=S,
                   help="MPI: how a rank waits in a collective: spin, yield (poll with sleeps), or auto = "
                        "yield when the ranks on a node outnumber its cores (auto)")
    g.add_argument("--no-progress", dest="progress", action="store_false", default=S,
                   help="no progress bar")
    return p


def load_toml(path: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        import tomli as tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise InvalidInputError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidInputError(f"config file {path} is not valid TOML: {e}") from None


def parse_config(argv=None) -> Config:
    args = vars(build_parser().parse_args(argv))
    values = load_toml(args.pop("config")) if args.get("config") else {}
    args.pop("config", None)
    values = {k.replace("-", "_"): v for k, v in values.items()}
    values.update(args)
    if isinstance(values.get("hidden"), str):
        try:
            values["hidden"] = tuple(int(h) for h in values["hidden"].split(",") if h.strip())
        except ValueError:
            raise InvalidInputError(f"--hidden must be comma-separated integers, got {values['hidden']!r}") from None
    return Config.from_flat(values)


def _mpi_launched() -> bool:
    return any(int(os.environ.get(v, "1")) > 1 for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"))


def main(argv=None) -> int:
    """Run the job; returns the exit code. Under MPI a failing rank prints
    ``hps: rank R of N failed: <Type>: <message>`` and aborts the whole job (no rank hangs)."""
    comm = None
    try:
        cfg = parse_config(argv)
        if _mpi_launched():
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        from ._run import run

        run(cfg, comm=comm, on_fatal=(lambda e: _abort(comm, e)) if comm is not None else None)
        return 0
    except KeyboardInterrupt:
        print("hps: interrupted", file=sys.stderr)
        return 130
    except (HpsError, OSError) as e:
        return _fail(comm, e, EXIT_BAD_INPUT if _is_bad_input(e) else EXIT_FAILED)
    except Exception as e:
        if comm is not None and comm.Get_size() > 1:
            _abort(comm, e)
        raise


def _abort(comm, e: BaseException) -> None:
    """End the whole MPI job for ``e``, naming this rank: one line for hps errors, the traceback for
    anything else (a bug). Also called from a failing pipeline thread (``Trainer(on_fatal=...)``)."""
    if comm.Get_size() < 2:
        return
    cause = e.__cause__ if getattr(e, "stage", None) else e
    if isinstance(cause, (HpsError, OSError)):
        _fail(comm, e, EXIT_BAD_INPUT if _is_bad_input(e) else EXIT_FAILED)
    else:
        from ..comm import abort_job

        abort_job(comm, e, EXIT_FAILED)


def _is_bad_input(e: BaseException) -> bool:
    cause = e.__cause__ if getattr(e, "stage", None) else None
    return isinstance(e, InvalidInputError) or isinstance(cause, InvalidInputError)


def _fail(comm, e: BaseException, code: int) -> int:
    if comm is not None and comm.Get_size() > 1:
        print(f"hps: rank {comm.Get_rank()} of {comm.Get_size()} failed: {e}", file=sys.stderr, flush=True)
        comm.Abort(code)
        return code
    print(f"hps: error: {e}", file=sys.stderr)
    return code
