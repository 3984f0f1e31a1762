"""The flush plan: which less urgent requests' tokens a flush writes, and when.

A share of the pending requests per transaction, the longest-waiting first,
flushes at least a gap apart; every request written within a bound, however
the pending set moves. Driven on a simulated clock (the plan takes it as an
argument).
"""

from __future__ import annotations

import random

import pytest

from fsched.core.daemon.flushplan import FlushBounds, due, next_due

BOUNDS = FlushBounds(every_s=1.0)  # the daemon's default: a share of 1/5, a flush every 0.2 s


def test_nothing_between_flushes_nor_before_requests_have_waited() -> None:
    pending = [(f"r{i}", 0.0) for i in range(10)]
    assert due(pending, last_flush_at=0.0, now=0.1, bounds=BOUNDS) == []  # within the gap
    assert due(pending, last_flush_at=float("-inf"), now=0.5, bounds=BOUNDS) == []  # not ripe yet
    assert due([], last_flush_at=float("-inf"), now=5.0, bounds=BOUNDS) == []


def test_a_share_at_a_time_oldest_first() -> None:
    pending = [(f"r{i}", 1.0 - i / 100) for i in range(10)]  # r9 has waited longest
    assert due(pending, last_flush_at=float("-inf"), now=2.0, bounds=BOUNDS) == ["r9", "r8"]  # 1/5 of 10


def test_overdue_requests_are_all_written_whatever_the_share() -> None:
    pending = [(f"old{i}", 0.0) for i in range(6)] + [(f"new{i}", 2.5) for i in range(4)]
    assert sorted(due(pending, float("-inf"), now=2.5, bounds=BOUNDS)) == [f"old{i}" for i in range(6)]


def test_a_tiny_interval_writes_every_step() -> None:
    assert due([("a", 5.0)], last_flush_at=5.0, now=5.0, bounds=FlushBounds(every_s=0.0)) == ["a"]


@pytest.mark.parametrize("seed", range(5))
def test_every_request_is_written_within_the_bound_and_writes_are_spread(seed: int) -> None:
    """256 slots producing a token each 20 ms step, requests ending and arriving at random: no
    transaction takes more than the share (bar overdue ones), none follows another within the gap,
    and no request waits past the overdue bound."""
    rng = random.Random(seed)
    waiting: dict[str, float] = {}  # dirty request -> since when (what the writer keeps)
    live = [f"s{seed}-{i}" for i in range(256)]
    last, now, born, longest = float("-inf"), 0.0, 256, 0.0
    flushes: list[tuple[float, int, int]] = []
    for _ in range(1_000):
        now += 0.02
        for i, request_id in enumerate(live):
            if rng.random() < 0.01:  # ended (its completion is written whole); a new one takes the slot
                waiting.pop(request_id, None)
                live[i] = request_id = f"s{seed}-{born}"
                born += 1
            waiting.setdefault(request_id, now)
        chosen = due(waiting.items(), last, now, BOUNDS)
        if chosen:
            assert now - last >= BOUNDS.gap_s - 1e-9
            flushes.append((now, len(chosen), len(waiting)))
            last = now
        for request_id in chosen:
            longest = max(longest, now - waiting.pop(request_id))
    assert longest <= BOUNDS.overdue_s
    assert max(n for _, n, _ in flushes) <= 0.2 * 256 + 1
    assert len(flushes) >= 0.8 * (now / BOUNDS.gap_s)  # spread: a share nearly every gap, not one lump


def test_next_due_is_the_first_moment_a_flush_writes_something() -> None:
    """`next_due` (a timed duty the daemon's wait for a remote engine ends at): exactly where `due`
    turns non-empty, by the gap or by the oldest request's ripening, whichever is later."""
    rng = random.Random(7)
    for _ in range(200):
        since = [rng.uniform(0.0, 3.0) for _ in range(rng.randint(1, 8))]
        last = rng.choice([float("-inf"), rng.uniform(0.0, 3.0)])
        at = next_due(since, last, BOUNDS)
        pending = [(f"r{i}", s) for i, s in enumerate(since)]
        assert due(pending, last, at + 1e-9, BOUNDS)
        assert not due(pending, last, at - 1e-6, BOUNDS)
    assert next_due([], 0.0, BOUNDS) is None
    assert next_due([1.0, 0.5], last_flush_at=0.0, bounds=BOUNDS) == pytest.approx(1.3)  # ripening
    assert next_due([0.0], last_flush_at=1.0, bounds=BOUNDS) == pytest.approx(1.2)  # the gap
