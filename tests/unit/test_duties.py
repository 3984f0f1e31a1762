"""How long a daemon's step may wait for a remote engine's tokens (core/daemon/duties.py): until its
first timed duty has been due `late_s` (the lateness a fixed 50 ms wait allowed), at most the cap; while
housekeeping is put off, `late_s`, as before."""

from __future__ import annotations

import pytest

from fsched.core.daemon.duties import Duties, wait_bound

CAP, LATE = 0.1, 0.05


def bound(now: float = 10.0, cap: float = CAP, **due) -> float:
    fields = {"sync_at": 10.08, "beat_at": 10.9, **due}
    return wait_bound(Duties(**fields), now, cap, LATE)


def test_the_wait_runs_until_the_first_duty_has_been_due_late_s():
    assert bound(cap=1.0) == pytest.approx(0.13)  # the sync, not a fixed 50 ms
    assert bound(beat_at=10.02) == pytest.approx(0.07)  # the heartbeat (and the leases it renews)
    assert bound(sweep_at=10.01) == pytest.approx(0.06)  # a shared queue's sweep
    assert bound(flush_at=10.0) == pytest.approx(0.05)  # the batch flush of linked tokens
    assert bound(sweep_at=None, flush_at=None, cap=1.0) == pytest.approx(0.13)


def test_at_most_the_cap_and_nothing_once_a_duty_is_late_s_overdue():
    assert bound(sync_at=11.0, beat_at=11.0) == CAP
    assert bound(sync_at=9.97) == pytest.approx(0.02)  # due already: what is left of its lateness
    assert bound(sync_at=9.5) == 0.0  # overdue past it: the turn does it now
    assert bound(sync_at=float("-inf")) == 0.0  # never synced yet


def test_while_housekeeping_is_put_off_its_due_times_do_not_end_the_wait():
    """Fresh latency work's step goes before overdue housekeeping (core/daemon/putoff.py): an overdue
    sync then must not make the step return at once, nor may the wait outlast `late_s`."""
    assert bound(sync_at=9.5, put_off=True) == LATE
    assert bound(sync_at=12.0, beat_at=12.0, put_off=True) == LATE
