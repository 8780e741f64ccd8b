"""Every feature's option check (admission and expiry, training control, the learning-rate schedule,
dense sync, HET, FAE), run by ``hps.config.TrainConfig`` on construction: each refuses the
combinations that cannot work, with the reason."""

from __future__ import annotations

import re

from ._options import (COMPRESS_MODES, CONSISTENCIES, DENSE_SYNCS, HET_POLICIES, LR_DECAYS, STALENESS_UNBOUNDED,
                       _one_of, _positive, parse_bytes)
from .errors import InvalidInputError


def _non_negative(t, *names) -> None:
    for name in names:
        if getattr(t, name) < 0:
            raise InvalidInputError(f"{name.replace('_', '-')} must be >= 0, got {getattr(t, name)}")


def _check_admission(t: "TrainConfig") -> None:
    """--admit-after, --admit-sketch-width, --expire-after (the owner of a key decides: owner sync)."""
    _non_negative(t, "admit_after", "expire_after")
    w = t.admit_sketch_width
    if w < 16 or w & (w - 1):
        raise InvalidInputError(f"admit-sketch-width must be a power of two >= 16, got {w}")
    if (t.admit_after > 1 or t.expire_after) and t.sparse_sync != "owner":
        raise InvalidInputError("--admit-after and --expire-after need --sparse-sync owner (the owner of "
                                "a key decides)")


def _check_control(t: "TrainConfig") -> None:
    """--eval-every, --early-stop (eval data is checked when the job's data is open)."""
    _non_negative(t, "eval_every", "early_stop")
    if t.early_stop and not t.eval_every:
        raise InvalidInputError("--early-stop needs --eval-every N (and eval data)")


def _check_schedule(t: "TrainConfig") -> None:
    """--lr-warmup, --lr-decay, --lr-decay-steps."""
    _non_negative(t, "lr_warmup", "lr_decay_steps")
    _one_of("lr-decay", t.lr_decay, LR_DECAYS)
    if t.lr_decay != "none" and t.lr_decay_steps < 1:
        raise InvalidInputError(f"--lr-decay {t.lr_decay} needs --lr-decay-steps N (steps = global "
                                "mini-batches)")


def _check_fae(t: "TrainConfig") -> None:
    """--fae, --hot-bytes (-> int bytes), --fae-sample-rate, --fae-holdout; FAE needs BSP and raw keys."""
    if t.hot_bytes is not None:
        t.hot_bytes = parse_bytes(t.hot_bytes)
        if t.hot_bytes < 0:
            raise InvalidInputError(f"hot-bytes must be >= 0, got {t.hot_bytes}")
    if t.fae == "auto" and t.hot_bytes is None:
        raise InvalidInputError("--fae auto needs --hot-bytes SIZE (HBM-PS bytes for the hot rows)")
    if t.fae is None and t.hot_bytes is not None:
        raise InvalidInputError("--hot-bytes is an option of --fae (give --fae auto or --fae PROFILE)")
    if not 0.0 < t.fae_sample_rate <= 100.0:
        raise InvalidInputError(f"fae-sample-rate must be a percentage in (0, 100], got {t.fae_sample_rate}")
    if t.fae_holdout < 0:
        raise InvalidInputError(f"fae-holdout must be >= 0, got {t.fae_holdout}")
    if t.fae is not None and t.consistency != "bsp":
        raise InvalidInputError("--fae pins hot rows on every rank and synchronises them each mini-batch: "
                                "it needs --consistency bsp")
    if t.fae is not None and t.admit_after > 1:
        raise InvalidInputError("--fae classifies raw keys as hot before admission could replace them: "
                                "drop --admit-after or --fae")


def _check_het(t: "TrainConfig") -> None:
    """--consistency, --staleness (-> int), --het-cache (-> a float fraction or int bytes),
    --het-policy; HET caches rows of their owners (owner sync) and sends them uncompressed."""
    _one_of("consistency", t.consistency, CONSISTENCIES)
    _one_of("het-policy", t.het_policy, HET_POLICIES)
    if isinstance(t.staleness, str):
        if t.staleness.strip().lower() not in ("inf", "infinity"):
            try:
                t.staleness = int(t.staleness)
            except ValueError:
                raise InvalidInputError(f"staleness must be an integer >= 0 or inf, got {t.staleness!r}") from None
        else:
            t.staleness = STALENESS_UNBOUNDED
    if not 0 <= t.staleness <= STALENESS_UNBOUNDED:
        raise InvalidInputError(f"staleness must be an integer >= 0 or inf, got {t.staleness}")
    cache = t.het_cache
    if isinstance(cache, str) and re.fullmatch(r"\s*[0-9]*\.[0-9]+\s*|\s*0\s*", cache):
        cache = float(cache)
    if isinstance(cache, float):
        if not 0.0 <= cache <= 1.0:
            raise InvalidInputError(f"het-cache must be a fraction in [0, 1] of the table or a size such as "
                                    f"64MiB, got {t.het_cache}")
        t.het_cache = cache
    else:
        t.het_cache = parse_bytes(cache)
        if t.het_cache < 0:
            raise InvalidInputError(f"het-cache must be >= 0, got {t.het_cache}")
    if t.consistency == "het" and t.sparse_sync != "owner":
        raise InvalidInputError("--consistency het caches rows of their owners: it needs --sparse-sync owner")
    if t.consistency == "het" and t.compress != "none":
        raise InvalidInputError("--compress applies to the BSP exchanges; --consistency het sends its rows and "
                                "pushes uncompressed: drop --compress or use --consistency bsp")


def _check_dense_sync(tc) -> None:
    """--dense-sync, --groups, --easgd-alpha, --easgd-every, --compress (the group count against the
    ranks is checked when the job's ranks are known)."""
    _positive(tc, "groups", "easgd_every")
    _one_of("dense-sync", tc.dense_sync, DENSE_SYNCS)
    _one_of("compress", tc.compress, COMPRESS_MODES)
    if tc.groups > 1 and tc.dense_sync != "easgd":
        raise InvalidInputError(f"--groups {tc.groups} needs --dense-sync easgd")
    if tc.easgd_alpha is not None and not 0 < tc.easgd_alpha * tc.groups <= 1:
        raise InvalidInputError(f"easgd-alpha x groups must lie in (0, 1] (the centre moves by alpha times the "
                                f"sum of the groups' differences), got {tc.easgd_alpha} x {tc.groups}")


#: Every feature's option check, each refusing the combinations that cannot work with its reason.
FEATURE_CHECKS = (_check_admission, _check_control, _check_schedule, _check_dense_sync, _check_het, _check_fae)
