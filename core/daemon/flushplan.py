"""Which less urgent requests' tokens a flush writes: a share of them at a time, oldest first.

Writing every batch request's tokens in one transaction once a second made
that one transaction long (hundreds of milliseconds on SQLite at 256 slots),
and the step loop, realtime first tokens included, waited behind it. A plan
spreads the same writes: each flush takes at most `share` of the pending
requests, the longest-waiting first, and flushes are at least `gap_s` apart.
A request is not written before it has waited `every_s - gap_s` (so one
pending request is not written five times as often as before), and is
written about once per `every_s`; one left waiting `overdue_s` is written
whatever the share, so the bound holds while the pending set grows.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from fsched.core.types import RequestId


@dataclass(frozen=True)
class FlushBounds:
    every_s: float  # each pending request written about this often
    share: float = 0.2  # at most this share of the pending requests per transaction
    min_gap_s: float = 0.1  # and at most 1/min_gap_s such transactions a second

    @property
    def gap_s(self) -> float:
        """Time between two flushes: the share of `every_s`, no less than `min_gap_s` (nor more
        than `every_s` itself)."""
        return min(max(self.every_s * self.share, self.min_gap_s), self.every_s)

    @property
    def overdue_s(self) -> float:
        return 2 * self.every_s


def due(pending: Iterable[tuple[RequestId, float]], last_flush_at: float, now: float,
        bounds: FlushBounds) -> list[RequestId]:
    """The requests to write now, oldest first; `pending` pairs a request with when its unwritten
    tokens began to wait. Empty between flushes (less than `gap_s` after `last_flush_at`)."""
    if now - last_flush_at < bounds.gap_s:
        return []
    waiting = list(pending)
    ripe_after, overdue_after = bounds.every_s - bounds.gap_s, bounds.overdue_s  # not a property call a row
    ripe = sorted((item for item in waiting if now - item[1] >= ripe_after), key=lambda item: item[1])
    take = math.ceil(len(waiting) * bounds.share)
    overdue = sum(1 for _, since in ripe if now - since >= overdue_after)
    return [request_id for request_id, _ in ripe[:max(take, overdue)]]


def next_due(pending_since: Iterable[float], last_flush_at: float, bounds: FlushBounds) -> float | None:
    """When `due` next writes something (None while nothing is pending): `gap_s` after the last flush,
    once the longest-waiting request has waited `every_s - gap_s`. `pending_since`: when each pending
    request's unwritten tokens began to wait."""
    oldest = min(pending_since, default=None)
    if oldest is None:
        return None
    return max(last_flush_at + bounds.gap_s, oldest + bounds.every_s - bounds.gap_s)
