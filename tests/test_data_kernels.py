"""The one-pass parse kernels and the synthetic kernels against their references, on mutated input.

``tests/reference/parse.py`` holds the two-pass kernels the one-pass ones replaced and
``tests/reference/synthetic.py`` the NumPy generator the kernels replaced: every count, malformed
line, reason, label, dense value and key — and every synthetic key, dense value, label and
probability — must be the same.
"""

import numpy as np
import pytest

from hps.data import MISSING_VALUE, NEGATIVE_VALUE, SyntheticData, make_keys
from hps.data._batch import FIELD_SHIFT
from hps.data._columns import plan_columns
from hps.data._criteo import _CODES as CRITEO_CODES
from hps.data._criteo_kernels import hex_digits, log1p_table, parse_criteo_keys
from hps.data._csv import _CODES as CSV_CODES
from hps.data._parse_kernels import parse_csv
from tests.reference import parse as ref
from tests.reference.synthetic import ReferenceSynthetic
from tests.test_data_criteo import _random_lines

#: Bytes a mutation inserts or writes: separators, line ends, signs, digits, hex, junk.
ALPHABET = b"\t,\r\n-+.e0123456789abcdefABCDEFxz "


def _mutated(rng, lines, sep):
    """``lines`` (bytes) with 0-2 random edits each, joined; sometimes CRLF, blank lines, no last EOL."""
    out = []
    for line in lines:
        b = bytearray(line)
        for _ in range(int(rng.integers(0, 3))):
            p = int(rng.integers(0, len(b) + 1))
            ch = ALPHABET[int(rng.integers(0, len(ALPHABET)))]
            op = int(rng.integers(0, 4))
            if op == 0:
                b.insert(p, ch)
            elif op == 1 and p < len(b):
                del b[p]
            elif op == 2 and p < len(b):
                b[p] = ch
            else:  # drop or duplicate a column
                cols = bytes(b).split(sep)
                k = int(rng.integers(0, len(cols)))
                cols = cols[:k] + cols[k + 1:] if rng.random() < 0.5 else cols[:k] + [cols[k]] + cols[k:]
                b = bytearray(sep.join(cols))
        out.append(bytes(b))
    text = b"\n".join(out) + b"\n"
    if rng.random() < 0.3:
        text = text.replace(b"\n", b"\r\n")
    if rng.random() < 0.3:
        text = b"\n" + text + b"\r\n\n"
    return np.frombuffer(text, np.uint8)


def _criteo_new(buf, cat, strict):
    n, F = int(np.count_nonzero(buf == 10)), 39 if cat else 26
    labels, dense, keys = np.zeros(n, np.float32), np.zeros((n, 13), np.float32), np.zeros((n, F), np.uint64)
    bl, bc = np.zeros(10, np.int64), np.zeros(10, np.int32)
    c = parse_criteo_keys(buf, cat, strict, np.uint64(MISSING_VALUE), np.uint64(NEGATIVE_VALUE), CRITEO_CODES,
                          hex_digits(), log1p_table(64), FIELD_SHIFT, labels, dense, keys, bl, bc)
    k = min(10, c[2])
    return c, labels[:c[1]], dense[:c[1]], keys[:c[1]].reshape(-1), bl[:k], bc[:k]


def _criteo_ref(buf, cat, strict):
    n, F = int(np.count_nonzero(buf == 10)), 39 if cat else 26
    labels, dense, values = np.zeros(n, np.float32), np.zeros((n, 13), np.float32), np.zeros((n, F), np.uint64)
    bl, bc = np.zeros(10, np.int64), np.zeros(10, np.int32)
    c = ref.parse_criteo(buf, cat, strict, np.uint64(MISSING_VALUE), np.uint64(NEGATIVE_VALUE), CRITEO_CODES,
                         labels, dense, values, bl, bc)
    k = min(10, c[2])
    keys = make_keys(np.tile(np.arange(F), c[1]), values[:c[1]].reshape(-1))
    return c, labels[:c[1]], dense[:c[1]], keys, bl[:k], bc[:k]


def _same(a, b):
    assert tuple(a[0]) == tuple(b[0])
    for x, y in zip(a[1:], b[1:]):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("seed", range(4))
def test_criteo_kernel_matches_the_two_pass_reference(seed):
    rng = np.random.default_rng(seed)
    base = [line.encode() for line in _random_lines(rng, 60)]
    base.append(b"1" + b"\t" * 39)                             # every feature missing
    base.append(b"0\t" + b"\t".join([b"4095", b"4096", b"-7", b"+3", b"0"] * 2 + [b"12"] * 3)
                + b"\t" + b"\t".join([b"fFfFfFfF"] * 26))       # table edge, signs, hex case
    for _ in range(60):
        buf = _mutated(rng, [base[i] for i in rng.integers(0, len(base), 40)], b"\t")
        for cat in (False, True):
            for strict in (False, True):
                _same(_criteo_new(buf, cat, strict), _criteo_ref(buf, cat, strict))


def _csv_run(kernel, buf, plan, strict):
    n, F, D = int(np.count_nonzero(buf == 10)), len(plan.categorical), len(plan.dense)
    labels, dense = np.zeros(n, np.float32), np.zeros((n, D), np.float32)
    out = np.zeros((n, F), np.uint64)
    bl, bc = np.zeros(10, np.int64), np.zeros(10, np.int32)
    if kernel is parse_csv:
        c = parse_csv(buf, plan.kind, plan.slot, strict, np.uint64(MISSING_VALUE), CSV_CODES, FIELD_SHIFT,
                      labels, dense, out, bl, bc)
        keys = out[:c[1]].reshape(-1)
    else:
        c = ref.parse_csv(buf, plan.kind, plan.slot, strict, np.uint64(MISSING_VALUE), CSV_CODES,
                          labels, dense, out, bl, bc)
        keys = make_keys(np.tile(np.arange(F), c[1]), out[:c[1]].reshape(-1))
    k = min(10, c[2])
    return c, labels[:c[1]], dense[:c[1]], keys, bl[:k], bc[:k]


@pytest.mark.parametrize("seed", range(4))
def test_csv_kernel_matches_the_two_pass_reference(seed):
    rng = np.random.default_rng(100 + seed)
    header = ["id", "click", "hour", "site", "price", "device", "c1"]
    plan = plan_columns(header, "click", dense_columns=["price", "hour"], ignore_columns=["id"])
    base = []
    for _ in range(60):
        vals = [f"a{rng.integers(0, 99)}", str(rng.choice(["0", "1", "-1"])), str(rng.integers(0, 10**8)),
                "" if rng.random() < 0.2 else f"{rng.integers(0, 2**32):x}", f"{rng.normal():.4g}",
                str(rng.choice(["", "ios", "android"])), "" if rng.random() < 0.3 else "xy"]
        base.append(",".join(vals).encode())
    base.append(b"a,1,1e39,s,1.5,d,c")  # beyond float32
    for _ in range(60):
        buf = _mutated(rng, [base[i] for i in rng.integers(0, len(base), 40)], b",")
        for strict in (False, True):
            _same(_csv_run(parse_csv, buf, plan, strict), _csv_run(ref.parse_csv, buf, plan, strict))


@pytest.mark.parametrize("kw", [
    dict(fields=5, vocab_per_field=300, seed=3),
    dict(fields=26, vocab_per_field=3_000_000, zipf=1.1, seed=1),         # ranks past the exact head
    dict(fields=8, vocab_per_field=2_000_000, zipf=1.0, n_dense=0, seed=2),  # the s = 1 closed form
    dict(fields=3, vocab_per_field=50, zipf=0.0, drift=0.5, seed=5),     # uniform, drifting
    dict(fields=200, vocab_per_field=100_000, zipf=0.5, seed=2**64 - 1),  # > 128 fields: pairwise halves
])
def test_synthetic_kernels_make_the_data_of_generator_version_1(kw):
    new = SyntheticData(rows=3000, batch_size=1024, **kw)
    old = ReferenceSynthetic(rows=3000, block_rows=1024, **kw)
    assert (new._a_s, new._a_d, new._bias) == (old._a_s, old._a_d, old._bias)
    for stream in (0, 1):
        for b in range(3):
            (x, px), (y, py) = new._generate(stream, b, 1024), old._generate(stream, b, 1024)
            np.testing.assert_array_equal(x.keys.reshape(-1), y.keys)
            np.testing.assert_array_equal(x.dense, y.dense)
            np.testing.assert_array_equal(x.labels, y.labels)
            np.testing.assert_array_equal(px, py)
