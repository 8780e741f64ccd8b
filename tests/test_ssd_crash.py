"""Crash tests: a child process dumps and deletes in a loop (optionally compacting) and is killed with
SIGKILL at random moments; every reopen must return every acknowledged row with its newest value, and
none of an acknowledged delete's keys.

The child prints ``ACK <gen> <k1,k2,...>;`` only after ``dump`` returned, ``DEL <gen> ...;`` after
``delete`` did (every third generation). Row values encode (gen, key), so the parent can tell which
dump a recovered row came from. A key may also hold the value of the one dump that was in flight at
the kill (never acknowledged, possibly durable), or be gone by the delete in flight - never hold an
older value (a deleted key's older copies stay in the files until compaction merges them away).
"""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hps.ssd import SSDOptions, SSDStore

ROOT = Path(__file__).resolve().parent.parent
DIM = 3
N_KEYS = 3000

CHILD = r"""
import sys, numpy as np
from hps.ssd import SSDStore, SSDOptions
path, gen0, compact = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
opts = SSDOptions(background=compact, compact_ratio=1.0, compact_interval_s=0.002)
import tempfile
with tempfile.TemporaryDirectory() as d:   # compile (or load) the dump and compaction kernels now, not in
    with SSDStore(d, %(dim)d, dtype=np.float64, rows_per_file=64,   # the first dump: on a cold Numba
                  options=SSDOptions(background=False)) as w:       # cache that outlasts every kill
        w.dump(np.arange(6, dtype=np.uint64), np.zeros((6, %(dim)d)))
        w.dump(np.arange(4, dtype=np.uint64), np.ones((4, %(dim)d)))
        w.compact()
s = SSDStore(path, %(dim)d, dtype=np.float64, rows_per_file=64, options=opts)
print("OPEN", flush=True)
gen = gen0
while True:
    rng = np.random.default_rng(gen)
    k = rng.choice(%(n)d, size=int(rng.integers(1, 400)), replace=False).astype(np.uint64)
    rows = np.empty((k.shape[0], %(dim)d))
    rows[:, 0] = gen
    rows[:, 1] = k
    rows[:, 2] = gen * 7.0 + k
    if gen %% 3 == 2:
        s.delete(k)
    else:
        s.dump(k, rows)
    sys.stdout.write("%%s %%d %%s;\n" %% ("DEL" if gen %% 3 == 2 else "ACK", gen, ",".join(map(str, k.tolist()))))
    sys.stdout.flush()
    if compact and gen %% 5 == 0:
        s.compact()
        print("CMP %%d" %% s.stats()["compactions"], flush=True)
    gen += 1
""" % dict(dim=DIM, n=N_KEYS)


def _run_and_kill(path, gen0, compact, rng):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(gen0), "1" if compact else "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    opened = threading.Event()

    def reader():
        for line in p.stdout:
            if line.startswith("OPEN"):
                opened.set()
            lines.append(line)
        opened.set()
    t = threading.Thread(target=reader)
    t.start()
    assert opened.wait(60), "child did not open the store"
    time.sleep(float(rng.uniform(0.05, 0.5)))
    p.send_signal(signal.SIGKILL)
    p.wait()
    t.join()
    err = p.stderr.read()
    assert p.returncode == -signal.SIGKILL, err
    acks = []
    for line in lines:
        if line[:4] in ("ACK ", "DEL ") and line.endswith(";\n"):
            g, ks = line[4:-2].split(" ")
            acks.append((int(g), np.array(ks.split(","), dtype=np.uint64)))
    compactions = sum(1 for line in lines if line.startswith("CMP "))
    return acks, compactions


def _deletes(gen) -> bool:
    return gen % 3 == 2


def _keys(gen):
    """The keys of generation ``gen``, as the child draws them."""
    rng = np.random.default_rng(gen)
    return rng.choice(N_KEYS, size=int(rng.integers(1, 400)), replace=False).astype(np.uint64)


def _check(path, latest, inflight_gen):
    with SSDStore(path, DIM, dtype=np.float64, rows_per_file=64,
                  options=SSDOptions(background=False)) as s:
        keys = np.arange(N_KEYS, dtype=np.uint64)
        rows, found = s.load(keys)
        st = s.stats()
        assert st["recovered_rows"] == found.sum()
    may_go = np.zeros(N_KEYS, dtype=bool)    # the delete in flight may have removed its keys
    if _deletes(inflight_gen):
        may_go[_keys(inflight_gen).astype(np.int64)] = True
    acked = latest >= 0
    assert found[acked & ~may_go].all(), "an acknowledged row was lost"
    # every row is internally consistent (never torn / wrong data)
    np.testing.assert_array_equal(rows[found, 1], keys[found].astype(np.float64))
    np.testing.assert_array_equal(rows[found, 2], rows[found, 0] * 7.0 + rows[found, 1])
    gens = np.where(found, rows[:, 0], -1).astype(np.int64)
    ok = (gens == latest) | (gens == inflight_gen) | (may_go & ~found)
    bad = np.flatnonzero(~ok)
    assert bad.size == 0, (f"key {bad[:5]} holds gen {gens[bad[:5]]}, newest acknowledged "
                           f"{latest[bad[:5]]} (in flight {inflight_gen})")
    return gens


@pytest.mark.slow
@pytest.mark.parametrize("compact", [False, True], ids=["dump", "dump+compaction"])
def test_sigkill_loses_no_acknowledged_row(tmp_path, compact):
    rng = np.random.default_rng(12345 + compact)
    path = tmp_path / "store"
    latest = np.full(N_KEYS, -1, dtype=np.int64)
    gen0 = 0
    total_acks = total_cmp = total_dels = 0
    for _ in range(5):
        acks, n_cmp = _run_and_kill(path, gen0, compact, rng)
        total_cmp += n_cmp
        for g, ks in acks:
            latest[ks.astype(np.int64)] = -1 if _deletes(g) else g
        total_acks += len(acks)
        total_dels += sum(_deletes(g) for g, _ in acks)
        inflight = (acks[-1][0] + 1) if acks else gen0
        gens = _check(path, latest, inflight)
        latest = gens     # latest or the in-flight dump (_check says so), or gone by the delete in flight
        gen0 = inflight + 1
    assert total_acks > 10 and total_dels > 3
    assert total_cmp > 0 or not compact
