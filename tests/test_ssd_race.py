"""Two processes creating one store at once (multiprocessing). The store's lock is taken before its
descriptor is written or trusted: the loser gets a typed error, and the winner's acknowledged rows
open afterwards, with the same and with different dims."""

import multiprocessing as mp
import time

import numpy as np
import pytest

from hps.errors import StoreFormatError, StoreLockedError
from hps.ssd import PosixEnv, SSDOptions, SSDStore

NOBG = SSDOptions(background=False, io_threads=1)
CTX = mp.get_context("spawn")  # a clean child: no thread or lock inherited from the test process
KEYS = np.arange(1, 2001, dtype=np.uint64)


def _rows(dim):
    return (KEYS[:, None].astype(np.float32) * np.arange(1, dim + 1, dtype=np.float32))


class _LateEnv(PosixEnv):
    """Sleeps after listing a directory: the process acts on what it saw only ``delay`` s later."""

    def __init__(self, delay):
        self.delay = delay

    def listdir(self, path):
        names = super().listdir(path)
        time.sleep(self.delay)
        return names


def _racer(me, plan, start, done, out):
    """For each (path, dim, delay) of ``plan``: wait for the other racer, create the store and dump
    rows into it, report, and hold the store open until the other racer has reported too."""
    for path, dim, delay in plan:
        start.wait()
        store = None
        try:
            store = SSDStore(path, dim, options=NOBG, env=_LateEnv(delay) if delay else None)
            store.dump(KEYS, _rows(dim))
            out.put((path, me, dim, "ok", ""))
        except Exception as e:  # noqa: BLE001 - reported to the test, which checks the type
            out.put((path, me, dim, type(e).__name__, str(e)))
        done.wait()
        if store is not None:
            store.close()


def _race(plans):
    """Run two racers over their plans (the same paths in the same order) -> {path: [(racer, dim,
    outcome, message), ...]}."""
    start, done, out = CTX.Barrier(2), CTX.Barrier(2), CTX.Queue()
    procs = [CTX.Process(target=_racer, args=(i, plans[i], start, done, out)) for i in range(2)]
    for p in procs:
        p.start()
    rounds = {}
    for _ in range(2 * len(plans[0])):  # two processes' puts arrive in any order
        path, *result = out.get(timeout=120)
        rounds.setdefault(path, []).append(tuple(result))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return rounds


def _check_round(path, results):
    """Exactly one racer created the store; the other got a typed error; the winner's rows open."""
    won = [r for r in results if r[2] == "ok"]
    lost = [r for r in results if r[2] != "ok"]
    assert len(won) == 1 and len(lost) == 1, results
    assert lost[0][2] in (StoreLockedError.__name__, StoreFormatError.__name__), lost
    dim = won[0][1]
    with SSDStore(path, dim, options=NOBG) as s:
        got, found = s.load(KEYS)
    assert found.all()
    np.testing.assert_array_equal(got, _rows(dim))


def test_a_late_creator_cannot_overwrite_the_winners_descriptor(tmp_path):
    """Racer 1 sees an empty directory and acts on it 1 s later, after racer 0 created the store
    (dim 4) and acknowledged rows: it must not write its own descriptor (dim 8) over racer 0's."""
    path = str(tmp_path / "s")
    _check_round(path, _race([[(path, 4, 0.0)], [(path, 8, 1.0)]])[path])


@pytest.mark.parametrize("dims", [(4, 4), (4, 8)], ids=["same-dim", "different-dim"])
def test_two_processes_racing_to_create_one_store(tmp_path, dims):
    n = 12
    paths = [str(tmp_path / f"s{i}") for i in range(n)]
    plans = [[(p, dims[0], 0.0) for p in paths], [(p, dims[1], 0.0) for p in paths]]
    rounds = _race(plans)
    for path in paths:
        _check_round(path, rounds[path])

