"""The yield-mode wait schedule (``hps.comm._wait``) on a fake clock, and the MPICH settings a job asks for
when its ranks outnumber the cores (``hps.comm._mpi``)."""

from __future__ import annotations

import pytest

from hps.comm import _wait as W


def test_next_sleep_doubles_to_the_cap_then_follows_the_time_waited():
    assert W.next_sleep(W.POLL_FIRST_S, 0.0) == 2 * W.POLL_FIRST_S
    assert W.next_sleep(W.POLL_MAX_S, 0.0) == W.POLL_MAX_S               # a short wait: the 200 µs cap
    waited = 4 * W.POLL_MAX_S / W.POLL_WAITED_FRACTION
    assert W.next_sleep(W.POLL_MAX_S, waited) == pytest.approx(4 * W.POLL_MAX_S)  # a long one: a share of it
    assert W.next_sleep(W.POLL_MAX_S, 10.0) == W.POLL_LONG_MAX_S         # never past the long cap
    assert W.POLL_MAX_S < W.POLL_LONG_MAX_S <= 2e-3 and 0 < W.POLL_WAITED_FRACTION <= 0.25


class _Clock:
    """A fake ``time``: ``sleep`` advances ``perf_counter``; every test of a request costs 1 µs."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def perf_counter(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def _wait_for(monkeypatch, done_at: float):
    """Wait (``poll``) for a request that completes ``done_at`` seconds in -> (tests, sleeps, the time
    its completion was seen)."""
    clock = _Clock()
    monkeypatch.setattr(W, "time", clock)
    monkeypatch.setattr(W.os, "sched_yield", lambda: None)

    class Request:
        tests = 0

        def Test(self):
            self.tests += 1
            clock.now += 1e-6
            return clock.now >= done_at

    r = Request()
    W.poll(r)
    return r.tests, clock.sleeps, clock.now


@pytest.mark.parametrize("done_at", [1e-5, 5e-4, 3e-3, 2e-2, 0.3])
def test_a_wait_sees_its_completion_late_by_a_share_of_its_length_with_few_tests(monkeypatch, done_at):
    tests, sleeps, seen = _wait_for(monkeypatch, done_at)
    late = seen - done_at
    # late by at most one sleep: the 200 µs cap, or a quarter of the wait, never over the long cap
    assert late <= min(max(W.POLL_MAX_S, W.POLL_WAITED_FRACTION * seen), W.POLL_LONG_MAX_S) + 2e-6
    assert sleeps == sorted(sleeps) and (not sleeps or sleeps[0] == W.POLL_FIRST_S)
    assert max(sleeps, default=0.0) <= W.POLL_LONG_MAX_S
    # the old schedule (200 µs sleeps all along) tested ~done_at / 200 µs times; this one far fewer on long waits
    assert tests <= W.POLL_YIELDS + 1 + 20 + done_at / W.POLL_LONG_MAX_S, (tests, done_at)
    if done_at >= 2e-2:
        assert tests < 0.5 * done_at / W.POLL_MAX_S


def test_short_waits_keep_the_short_schedule(monkeypatch):
    """Under ~1 ms the sleeps are those of before (20 µs doubling to 200 µs): a peer's rendezvous step that
    needs this rank's next call waits no longer than it did."""
    _, sleeps, _ = _wait_for(monkeypatch, 6e-4)
    assert sleeps[:4] == [W.POLL_FIRST_S * 2 ** i for i in range(4)] and max(sleeps) == W.POLL_MAX_S


def test_mpich_cells_carry_every_message_under_the_single_copy_threshold():
    """A message under the CMA threshold must fit one cell (else MPICH pipelines it through several, which
    again needs the receiver's calls), the pack buffer must hold a cell (MPICH aborts otherwise), and the
    cells' ``/dev/shm`` per rank stays what it was (64 cells of 68 KiB)."""
    from hps.comm._mpi import MPICH_SETTINGS as S

    cell = int(S["MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_CELL_SIZE"])
    assert int(S["MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD"]) <= cell - 4096     # room for the cell's header
    assert int(S["MPIR_CVAR_CH4_PACK_BUFFER_SIZE"]) >= cell
    assert cell * int(S["MPIR_CVAR_CH4_SHM_POSIX_IQUEUE_NUM_CELLS"]) <= 64 * 69632
    # the fused message of the job at 4 ranks: a 143,105 / 4-float dense block plus rows
    assert int(S["MPIR_CVAR_CH4_IPC_CMA_P2P_THRESHOLD"]) >= 4 * (-(-143105 // 4)) + 256 * 1024
