"""When a daemon puts its housekeeping off so fresh latency work reaches the engine first.

Latency work claimed since the last step began waits for a step to take
it to the engine: the turn that claimed it puts its batch flush and
heartbeat off, and the pass after it its sync and sweep, so that step
comes first. Never for longer than `limit_s` in a row (the sync
interval), so weights, cancels and batch tokens wait that long at most,
whatever the arrivals. Pure: the caller passes the clock's reading.
"""

from __future__ import annotations

from collections.abc import Iterable

from fsched.core.sched.request import Request
from fsched.core.types import RequestClass


class PutOff:
    __slots__ = ("limit_s", "_fresh", "_since")

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._fresh = False  # latency work claimed since the last step began
        self._since: float | None = None  # put off since then (None: nothing is)

    @property
    def hurrying(self) -> bool:
        """Whether housekeeping is being put off now (the next pass skips its sync and sweep)."""
        return self._since is not None

    def claimed(self, requests: Iterable[Request]) -> None:
        # Batch work has no first token to hurry: only latency work puts the housekeeping off.
        self._fresh = self._fresh or any(r.request_class is not RequestClass.BATCH for r in requests)

    def stepping(self) -> None:
        """A step begins: it takes what was claimed so far to the engine."""
        self._fresh = False

    def idle(self) -> None:
        """Nothing to step: nothing goes first."""
        self._since = None

    def puts_off(self, now: float) -> bool:
        """Whether the turn ending now leaves its batch flush and heartbeat for later."""
        since = self._since
        if self._fresh and (since is None or now - since < self.limit_s):
            self._since = now if since is None else since
            return True
        self._since = None
        return False
