"""``python -m hps.train``: its argument parser, and the job's ``Config`` from the command line and
``--config FILE.toml`` (:func:`parse_config`); the job itself runs in ``hps.train._main``.

Every flag can also be given as a key of ``--config FILE.toml`` (same names, dashes or underscores;
switches as ``strict = true``, ``resume = true``, ``no-progress = true``; keys may be grouped in the
sections ``[data]``, ``[model]``, ``[tiers]``, ``[train]``; flags on the command line win). Errors
become one line on stderr and exit code 2 (bad input) or 1; an interrupt (Ctrl-C, SIGTERM) exits
130 / 143 after saying where the last checkpoint is.
"""

from __future__ import annotations

import argparse

from .._argparse import ArgumentParser, comma_names
from .._options import DEFAULT_BATCH_SIZE, DEFAULT_BUDGET_FRACTION
from ..config import (COMPRESS_MODES, CONSISTENCIES, DENSE_OPTIMIZERS, DENSE_SYNCS, DEVICES, FORMATS,
                      HET_POLICIES, LR_DECAYS, MODELS, MPI_WAITS, PAGE_CACHE_MODES, SPARSE_OPTIMIZERS,
                      SPARSE_SYNCS, Config, flatten_options)
from ..data import DEFAULT_MAX_MALFORMED, DENSE_TRANSFORMS
from ..errors import InvalidInputError


def build_parser() -> ArgumentParser:
    p = ArgumentParser(
        prog="python -m hps.train",
        description="Train a CTR model over the HBM/DRAM/SSD parameter hierarchy. With no arguments: "
                    "synthetic data on the CPU, in about a minute.")
    S = argparse.SUPPRESS  # unset flags stay absent, so TOML values and dataclass defaults apply
    g = p.add_argument_group("data")
    g.add_argument("--config", help="TOML file with any of these options as keys")
    g.add_argument("--format", choices=FORMATS, default=S,
                   help="data format (default: told by the --data file names, .csv .parquet .libsvm .libfm, or "
                        "a .txt/.tsv file's first line; synthetic without --data)")
    g.add_argument("--data", nargs="+", default=S,
                   help="training data: files, directories or globs (quoted), plain, .gz or .zst")
    g.add_argument("--eval-data", nargs="+", default=S,
                   help="evaluation data, the same (synthetic: built-in split)")
    g.add_argument("--rows", type=int, default=S, help="synthetic: training examples (200000)")
    g.add_argument("--fields", type=int, default=S, help="synthetic: categorical fields (8)")
    g.add_argument("--vocab-per-field", type=int, default=S, help="synthetic: values per field (20000)")
    g.add_argument("--zipf", type=float, default=S, help="synthetic: Zipf exponent (1.1)")
    g.add_argument("--n-dense", type=int, default=S, help="synthetic: dense features (4)")
    g.add_argument("--drift", type=float, default=S,
                   help="synthetic: popularity ranks shifted per example, so new keys keep arriving (0)")
    g.add_argument("--label-column", default=S, help="csv, parquet: label column (click)")
    g.add_argument("--ignore-columns", default=S, help="csv, parquet: columns to drop, comma separated")
    g.add_argument("--dense-columns", default=S,
                   help="csv, parquet: numeric columns, the dense features, comma separated")
    g.add_argument("--categorical-columns", default=S,
                   help="csv, parquet: the categorical fields in field-id order, comma separated "
                        "(default: every column not given another part, in table order)")
    g.add_argument("--dense-transform", choices=DENSE_TRANSFORMS, default=S,
                   help="csv, parquet: transform of the dense columns: log1p = sign(x) log1p(|x|) (Criteo's), "
                        "standardize = (x - mean) / std of the first 65,536 training examples (none)")
    g.add_argument("--int-as-categorical", action="store_true", default=S,
                   help="criteo: also bucketize the 13 integer columns into fields 26..38")
    g.add_argument("--libsvm-fields", type=int, default=S, help="libsvm: positional fields")
    g.add_argument("--strict", action="store_true", default=S, help="stop at the first malformed line")
    g.add_argument("--data-shards", type=int, default=S,
                   help="shards the data is cut into, read K/N per rank; one process with K shards "
                        "trains exactly like K ranks (default: the number of ranks)")
    g.add_argument("--max-malformed", type=float, default=S, metavar="FRACTION",
                   help="stop when more than this fraction of the data lines are malformed "
                        f"({DEFAULT_MAX_MALFORMED}); malformed lines below it are skipped and reported")
    g.add_argument("--readers", type=int, default=S, metavar="N",
                   help="threads that parse (or generate) the batches of each rank, in parallel; the "
                        "batches are the same for any N (this rank's cores minus 3, 1 to 8)")
    g = p.add_argument_group("model")
    g.add_argument("--model", choices=MODELS, default=S, help="network (ctr); see docs/models.md")
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
    g.add_argument("--mem-budget", default=S, help="each rank's host memory as a whole (model, HBM-PS twin, batches "
                   "in flight, SSD-PS buffers and index, MEM-PS cache) in binary units: 512MiB = 512MB = 512m = "
                   f"512 * 2^20 bytes, or a byte count ({DEFAULT_BUDGET_FRACTION} of the memory available, over "
                   "the ranks on the node)")
    g.add_argument("--ssd-path", default=S, help="SSD-PS root: each rank claims its own rank{r}-of-{n}/ in it, "
                   "which must be missing or empty, and removes it at the end (a temporary directory)")
    g.add_argument("--keep-ssd", action="store_true", default=S,
                   help="keep this job's SSD-PS at the end instead of removing it")
    g.add_argument("--rows-per-file", type=int, default=S, help="SSD-PS rows per file (16384)")
    g.add_argument("--ssd-page-cache", choices=PAGE_CACHE_MODES, default=S,
                   help="SSD-PS reads: O_DIRECT, or through the page cache dropping what was read, or plain (direct)")
    g.add_argument("--hbm-capacity", type=int, default=S, help="HBM-PS initial keys (from batch 1; grows up to "
                   "--hbm-budget)")
    g.add_argument("--hbm-budget", default=S, help="HBM-PS bytes, in the units of --mem-budget: bounds the rows "
                   "resident across batches; the coldest leave when it is reached (cuda: half the GPU's free "
                   "memory at start; cpu: the twin's share the memory plan prints)")
    g.add_argument("--n-parts", type=int, default=S, help="HBM-PS parts per process (1)")
    g.add_argument("--gpus", type=int, default=S, help="cuda: GPUs the parts spread over, part p on GPU "
                   "p %% gpus (every visible GPU)")
    g = p.add_argument_group("training")
    g.add_argument("--batch-size", type=int, default=S, help=f"examples per batch, whole job ({DEFAULT_BATCH_SIZE})")
    g.add_argument("--minibatch-size", type=int, default=S, help="examples per update, whole job (1024)")
    g.add_argument("--epochs", type=int, default=S, help="(1)")
    g.add_argument("--seed", type=int, default=S, help="in [0, 2^64 - 1] (0)")
    g.add_argument("--queue-depth", type=int, default=S, help="items between pipeline stages (1)")
    g.add_argument("--blas-threads", type=int, default=S, help="threads of the dense model while training "
                   "(default: sized between batches to the cores the other stages leave idle)")
    g.add_argument("--gil-switch-interval", type=float, default=S, help="seconds the interpreter lets a thread "
                   "hold the GIL while another waits, during training (default: 0.001 with --device cuda, whose "
                   "train stage takes the GIL back after every GPU call; else Python's, 0.005)")
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
    g.add_argument("--ranks-per-node", type=int, default=S, help="MPI: ranks per node (auto); no effect on "
                   "training, whose sums across ranks are in rank order whatever the nodes")
    g.add_argument("--sparse-sync", choices=SPARSE_SYNCS, default=S,
                   help="MPI: owner = each row lives at its owner rank, which serves it and applies its "
                        "summed gradient; allreduce = every rank holds the batch's rows (Appendix C.3) (owner)")
    g.add_argument("--mpi-wait", choices=MPI_WAITS, default=S,
                   help="MPI: how a rank waits in a collective: spin, yield (poll with sleeps), or auto = "
                        "yield when the ranks on a node outnumber its cores (auto)")
    g.add_argument("--consistency", choices=CONSISTENCIES, default=S,
                   help="MPI: bsp = every mini-batch synchronous; het = per-rank caches of other ranks' rows "
                        "with per-embedding clocks bounded by --staleness (HET, seed 001) (bsp)")
    g.add_argument("--staleness", default=S, metavar="S",
                   help="het: clock bound s, an integer >= 0 or inf; 0 trains exactly like bsp (100)")
    g.add_argument("--het-cache", default=S, metavar="FRACTION_OR_BYTES",
                   help="het: per-rank cache of rows owned by other ranks, a fraction of the embedding table "
                        "such as 0.1 (synthetic data) or a size such as 64MiB (64MiB)")
    g.add_argument("--het-policy", choices=HET_POLICIES, default=S, help="het: cache eviction policy (lfu)")
    g.add_argument("--no-progress", dest="progress", action="store_false", default=S,
                   help="no progress bar")
    _control_flags(g, S)
    _hierarchical_training_flags(p, S)
    return p


def _hierarchical_training_flags(p, S) -> None:
    """Hierarchical Training (seeds/002 §3: --dense-sync, --groups, --easgd-*, --compress) and --op-osrp
    (seeds/004 §2)."""
    g = p.add_argument_group("hierarchical training and hashing")
    g.add_argument("--dense-sync", choices=DENSE_SYNCS, default=S,
                   help="MPI: allreduce = one dense copy, gradients summed over all ranks; easgd = --groups "
                        "copies, background EASGD with a centre copy (allreduce)")
    g.add_argument("--groups", type=int, default=S, help="easgd: contiguous rank groups, one dense copy each (1)")
    g.add_argument("--easgd-alpha", type=float, default=S, help="easgd: elastic moving rate (0.9 / groups)")
    g.add_argument("--easgd-every", type=int, default=S, help="easgd: mini-batches between EASGD rounds (4)")
    g.add_argument("--compress", choices=COMPRESS_MODES, default=S,
                   help="MPI traffic: bf16 = dense and sparse traffic as bfloat16; int8 = rows served as int8 "
                        "with a per-row scale, gradients bf16 (none)")
    g.add_argument("--op-osrp", type=int, default=S, metavar="BINS",
                   help="hash each example's sparse features into 2 x BINS binary features (one permutation "
                        "+ one sign random projection) before training")


def _control_flags(g, S) -> None:
    """Admission, expiry and training control (docs/admission.md), in the ``training`` group (TOML
    section ``[train]``)."""
    g.add_argument("--admit-after", type=int, default=S, metavar="K",
                   help="a key gets its own row from its K-th occurrence; before, its field's shared row (0: at once)")
    g.add_argument("--admit-sketch-width", type=int, default=S,
                   help="counters per row of each rank's 4-row count-min sketch, a power of two (1048576)")
    g.add_argument("--expire-after", type=int, default=S, metavar="B",
                   help="delete keys unused for B batches from every tier (0: never; at least 3)")
    g.add_argument("--eval-every", type=int, default=S, metavar="N",
                   help="evaluate on the eval data every N batches during training (0: at the end only)")
    g.add_argument("--early-stop", type=int, default=S, metavar="P",
                   help="stop after P evaluations without a better AUC; keeps the best checkpoint (0: never)")
    g.add_argument("--lr-warmup", type=int, default=S, metavar="STEPS",
                   help="linear learning-rate warm-up over STEPS global mini-batches (0)")
    g.add_argument("--lr-decay", choices=LR_DECAYS, default=S, help="learning-rate decay after the warm-up (none)")
    g.add_argument("--lr-decay-steps", type=int, default=S,
                   help="cosine: steps down to 0; step: steps per x0.1 (needed with --lr-decay)")
    g.add_argument("--shuffle-buffer", type=int, default=S, metavar="N",
                   help="seeded streaming shuffle of each data shard through N examples (0: off)")


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
    for key in ("data", "eval_data"):  # one path stays a string; several are a tuple
        if isinstance(values.get(key), (list, tuple)):
            values[key] = values[key][0] if len(values[key]) == 1 else tuple(values[key])
    for key in ("ignore_columns", "dense_columns", "categorical_columns"):
        if isinstance(values.get(key), str):
            values[key] = comma_names(values[key])
    for key in ("hidden", "bottom_mlp", "top_mlp"):
        if isinstance(values.get(key), str):
            try:
                values[key] = tuple(int(h) for h in values[key].split(",") if h.strip())
            except ValueError:
                flag = "--" + key.replace("_", "-")
                raise InvalidInputError(f"{flag} must be comma-separated integers, got {values[key]!r}") from None
    return Config.from_flat(values)
