"""``python -m hps.predict``: score data with a trained model from the command line (its parser:
``hps.cli``); exit codes as ``python -m hps.train``."""

from __future__ import annotations

from pathlib import Path

from ..cli import EXIT_BAD_INPUT, EXIT_FAILED, build_predict_parser, check_writable, fail, is_bad_input
from ..data import infer_format, is_converted
from ..errors import HpsError, InvalidInputError
from ._predictor import Predictor


def predict_main(argv=None) -> int:
    """``python -m hps.predict``; returns the exit code (2 bad input, 1 failure)."""
    args = build_predict_parser().parse_args(argv)
    try:
        if args.batch_size < 1:
            raise InvalidInputError(f"--batch-size must be positive, got {args.batch_size}")
        if args.readers < 1:
            raise InvalidInputError(f"--readers must be positive, got {args.readers}")
        check_writable("--out", Path(args.out), is_dir=False)
        pred = Predictor(args.model_dir, unknown=args.unknown)
        data = args.data[0] if len(args.data) == 1 else args.data
        named = infer_format(data, required=False)
        if named not in (None, pred.format) and not is_converted(data):  # hps.convert's data: Predictor checks it
            raise InvalidInputError(f"--data is {named} data by its file names, but the model in {args.model_dir} "
                                    f"was trained on {pred.format} data (hps.predict reads the training format)")
        res = pred.write_csv(data, args.out, batch_size=args.batch_size, strict=args.strict,
                             max_malformed=args.max_malformed, readers=args.readers)
    except (HpsError, OSError) as e:
        return fail(None, e, EXIT_BAD_INPUT if is_bad_input(e) else EXIT_FAILED)
    auc = f"; AUC {res['auc']:.4f}" if res["auc"] is not None else ""
    skipped = f" ({res['malformed']} malformed lines skipped)" if res["malformed"] else ""
    print(f"hps: scored {res['examples']} examples{skipped} with {args.model_dir} -> {args.out}{auc}")
    return 0
