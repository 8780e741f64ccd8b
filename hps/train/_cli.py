"""``python -m hps.train``: the command line. The only module that parses arguments.

Every flag can also be given as a key of ``--config FILE.toml`` (same names, dashes or underscores;
switches as ``strict = true``, ``resume = true``, ``no-progress = true``; keys may be grouped in the
sections ``[data]``, ``[model]``, ``[tiers]``, ``[train]``; flags on the command line win). Errors
become one line on stderr and exit code 2 (bad input) or 1; an interrupt (Ctrl-C, SIGTERM) exits
130 / 143 after saying where the last checkpoint is.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from ..config import (DENSE_OPTIMIZERS, DEVICES, FORMATS, MODELS, MPI_WAITS, PAGE_CACHE_MODES,
                      SPARSE_OPTIMIZERS, SPARSE_SYNCS, Config, flatten_options)
from ..data import DEFAULT_MAX_MALFORMED
from ..errors import HpsError, InvalidInputError, InvalidTypeError

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
    g.add_argument("--max-malformed", type=float, default=S, metavar="FRACTION",
                   help="stop when more than this fraction of the data lines are malformed "
                        f"({DEFAULT_MAX_MALFORMED}); malformed lines below it are skipped and reported")
    g = p.add_argument_group("model")
    g.add_argument("--model", choices=MODELS, default=S, help="network (ctr); see README 'Models'")
    g.add_argument("--embedding-dim", type=int, default=S, help="embedding width (16)")
    g.add_argument("--hidden", default=S, help="MLP hidden sizes, comma separated (128,64)")
    g.add_argument("--cross-layers", type=int, default=S, help="dcn: cross layers (3)")
    g.add_argument("--bottom-mlp", default=S,
                   help="dlrm: bottom MLP widths over the dense features, ending at --embedding-dim (64,D)")
    g.add_argument("--top-mlp", default=S, help="dlrm: top MLP hidden widths (--hidden)")
    g.add_argument("--sparse-optimizer", choices=SPARSE_OPTIMIZERS, default=S, help="row optimizer (adagrad)")
    g.add_argument("--dense-optimizer", choices=DENSE_OPTIMIZERS, default=S, help="(adam)")
    g.add_argument("--emb-l2", type=float, default=S, help="L2 on the rows a mini-batch uses (0)")
    g.add_argument("--lr", type=float, default=S, help="embedding learning rate (0.2)")
    g.add_argument("--dense-lr", type=float, default=S, help="MLP learning rate (0.001)")
    g.add_argument("--adagrad-init", type=float, default=S,
                   help="initial Adagrad accumulator, rows and dense (0.001)")
    g = p.add_argument_group("tiers")
    g.add_argument("--device", choices=DEVICES, default=S, help="HBM-PS and model device (cpu)")
    g.add_argument("--mem-budget", default=S, help="MEM-PS DRAM budget in binary units: 512MiB = 512MB "
                   "= 512m = 512 * 2^20 bytes, or a byte count (256MiB)")
    g.add_argument("--ssd-path", default=S, help="SSD-PS root: each rank claims its own rank{r}-of-{n}/ in it, "
                   "which must be missing or empty, and removes it at the end (a temporary directory)")
    g.add_argument("--keep-ssd", action="store_true", default=S,
                   help="keep this job's SSD-PS at the end instead of removing it")
    g.add_argument("--rows-per-file", type=int, default=S, help="SSD-PS rows per file (16384)")
    g.add_argument("--ssd-page-cache", choices=PAGE_CACHE_MODES, default=S,
                   help="SSD-PS reads: O_DIRECT, or through the page cache dropping what was read, or plain (direct)")
    g.add_argument("--hbm-capacity", type=int, default=S, help="HBM-PS keys (sized from batch 1)")
    g.add_argument("--n-parts", type=int, default=S, help="HBM-PS parts / GPUs per process (1)")
    g = p.add_argument_group("training")
    g.add_argument("--batch-size", type=int, default=S, help="examples per batch, whole job (16384)")
    g.add_argument("--minibatch-size", type=int, default=S, help="examples per update, whole job (1024)")
    g.add_argument("--epochs", type=int, default=S, help="(1)")
    g.add_argument("--seed", type=int, default=S, help="in [0, 2^64 - 1] (0)")
    g.add_argument("--queue-depth", type=int, default=S, help="items between pipeline stages (1)")
    g.add_argument("--checkpoint-dir", default=S, help="write checkpoints here")
    g.add_argument("--checkpoint-every", type=int, default=S, help="batches between checkpoints (0: per epoch)")
    g.add_argument("--resume", action="store_true", default=S, help="continue from --checkpoint-dir")
    g.add_argument("--keep-checkpoints", type=int, default=S,
                   help="complete checkpoints kept; --resume falls back to an older one if the newest "
                        "is damaged (1)")
    g.add_argument("--export", default=S, help="write the trained model as HDF5 into this directory")
    g.add_argument("--metrics-out", default=S, help="write metrics as JSON to this file")
    g.add_argument("--plots", default=S, help="draw figures (PNG) into this directory (matplotlib)")
    g.add_argument("--fae", default=S, metavar="PROFILE|auto",
                   help="FAE: pin the hot rows of this profile (python -m hps.profile) on every rank and train "
                        "all-hot and all-cold mini-batches apart; auto: profile the data first (needs --hot-bytes)")
    g.add_argument("--hot-bytes", default=S, help="FAE: HBM-PS bytes for the hot rows (512MiB, 2g, bytes)")
    g.add_argument("--fae-sample-rate", type=float, default=S, help="FAE auto: percent of the input profiled (5)")
    g.add_argument("--fae-holdout", type=int, default=S,
                   help="FAE: eval examples whose loss drives the Shuffle Scheduler (1024)")
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
    except OSError as e:
        raise InvalidInputError(f"cannot read config file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InvalidInputError(f"config file {path} is not UTF-8 text (a TOML file is)") from None
    except tomllib.TOMLDecodeError as e:
        raise InvalidInputError(f"config file {path} is not valid TOML: {e}") from None


def parse_config(argv=None) -> Config:
    args = vars(build_parser().parse_args(argv))
    values = flatten_options(load_toml(args.pop("config"))) if args.get("config") else {}
    args.pop("config", None)
    values.update(args)
    for key in ("hidden", "bottom_mlp", "top_mlp"):
        if isinstance(values.get(key), str):
            try:
                values[key] = tuple(int(h) for h in values[key].split(",") if h.strip())
            except ValueError:
                flag = "--" + key.replace("_", "-")
                raise InvalidInputError(f"{flag} must be comma-separated integers, got {values[key]!r}") from None
    return Config.from_flat(values)


def _mpi_launched() -> bool:
    return any(int(os.environ.get(v, "1")) > 1 for v in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"))


class _Terminated(KeyboardInterrupt):
    """SIGTERM (what schedulers send), raised in the main thread so it unwinds like Ctrl-C."""


def _raise_terminated(signum, frame):
    raise _Terminated()


def main(argv=None) -> int:
    """Run the job; returns the exit code. Under MPI a failing rank prints
    ``hps: rank R of N failed: <Type>: <message>`` and aborts the whole job (no rank hangs).

    Ctrl-C (SIGINT) and SIGTERM stop the pipeline, remove the temporary SSD-PS, say where the last
    checkpoint is and exit 130 / 143 (128 + the signal). ``mpiexec`` forwards both signals to every
    rank: each rank cleans up, the ranks wait for each other (a bounded wait) and all exit."""
    comm, cfg = None, None
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main else None
    try:
        cfg = parse_config(argv)
        if _mpi_launched():
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        from ._run import run

        run(cfg, comm=comm, on_fatal=(lambda e: _abort(comm, e)) if comm is not None else None)
        return 0
    except KeyboardInterrupt as e:
        return _interrupted(comm, cfg, signal.SIGTERM if isinstance(e, _Terminated) else signal.SIGINT)
    except (HpsError, OSError) as e:
        return _fail(comm, e, EXIT_BAD_INPUT if _is_bad_input(e) else EXIT_FAILED)
    except Exception as e:
        if comm is not None and comm.Get_size() > 1:
            _abort(comm, e)
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


#: Under MPI, how long an interrupted rank waits for the others to finish cleaning up before it
#: aborts the job (a rank that never got the signal would otherwise keep the job alive).
INTERRUPT_SYNC_S = 30.0


def _interrupted(comm, cfg, signum) -> int:
    """Report an interrupt (the job's own files are already removed by ``run``) -> 128 + signum."""
    code = 128 + int(signum)
    if comm is None or comm.Get_rank() == 0:
        print(f"hps: interrupted by {signal.Signals(signum).name}: training stopped. {_resume_hint(cfg)}",
              file=sys.stderr, flush=True)
    if comm is not None and comm.Get_size() > 1:
        _leave_together(comm, code)
    return code


def _resume_hint(cfg) -> str:
    from ._checkpoint import last_checkpoint

    ck = cfg.train.checkpoint_dir if cfg is not None else None
    if not ck:
        return "No checkpoint was written (no --checkpoint-dir): a new run starts from the beginning."
    last = last_checkpoint(ck)
    if last is None:
        return f"No checkpoint was completed in {ck} yet: a new run starts from the beginning."
    return (f"The last checkpoint is {last}: to continue, run the same command with "
            f"--resume --checkpoint-dir {ck}")


def _leave_together(comm, code: int) -> None:
    """Every rank has cleaned up: meet the others (non-blocking barrier on ``comm``, which the
    trainer's threads never use: they have their own duplicates) and exit at once, without
    MPI_Finalize, which could wait for ever on a collective a stopped peer never joined. A rank
    that is not there within INTERRUPT_SYNC_S takes the job down with MPI_Abort."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + INTERRUPT_SYNC_S
    while not req.Test():
        if time.monotonic() > deadline:
            comm.Abort(code)
        time.sleep(0.01)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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
    bad = (InvalidInputError, InvalidTypeError)
    return isinstance(e, bad) or isinstance(cause, bad)


def _fail(comm, e: BaseException, code: int) -> int:
    if comm is not None and comm.Get_size() > 1:
        from ..comm._failure import abort, failure_message

        print(failure_message(comm, e), file=sys.stderr, flush=True)
        abort(comm, code)
        return code
    print(f"hps: error: {e}", file=sys.stderr)
    return code
