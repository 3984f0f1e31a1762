"""The requests a daemon holds: their live records (core/sched/request.py), by id, in claim order.

A record is the one the engine and its scheduler run: the daemon's lease on
it, its first token's time and whether its output waits to be written are
fields of the same record, not a second copy. The engine stamps the first
token on its own (monotonic) clock; what the daemon writes and sends is that
time on its wall clock, by the two clocks' offset as the last step read them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from fsched.core.sched.request import Request
from fsched.core.types import RequestClass, RequestId


class Holdings:
    """Held requests by id, in claim order."""

    def __init__(self) -> None:
        self._held: dict[RequestId, Request] = {}
        self._fresh: dict[RequestId, Request] = {}  # turned dirty since the writer last took them
        self._groups: dict[tuple[str, RequestClass], int] = {}  # held by (tenant, class), kept as they come
        self.wall_offset = 0.0  # the daemon's wall clock minus the engine's, at the last step's end

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: RequestId) -> bool:
        return request_id in self._held

    def __iter__(self) -> Iterator[tuple[RequestId, Request]]:
        return iter(list(self._held.items()))

    def add(self, request: Request) -> None:
        self._uncount(self._held.get(request.id))
        self._held[request.id] = request
        group = (request.tenant, request.request_class)
        self._groups[group] = self._groups.get(group, 0) + 1

    def get(self, request_id: RequestId) -> Request | None:
        return self._held.get(request_id)

    def pop(self, request_id: RequestId) -> Request | None:
        request = self._held.pop(request_id, None)
        self._uncount(request)
        return request

    def _uncount(self, request: Request | None) -> None:
        if request is None:
            return
        group = (request.tenant, request.request_class)
        left = self._groups[group] - 1
        if left:
            self._groups[group] = left
        else:
            del self._groups[group]

    def stepped(self, wall_now: float, engine_now: float | None) -> None:
        """A step ended at `engine_now` on the engine's clock, `wall_now` on the daemon's."""
        if engine_now is not None:
            self.wall_offset = wall_now - engine_now

    def produced(self, request_ids: Iterable[RequestId]) -> None:
        """A step produced tokens for these requests (those still held): their output waits to be
        written."""
        held, fresh = self._held, self._fresh
        for request_id in request_ids:
            if (request := held.get(request_id)) is not None:
                request.dirty = True
                fresh[request_id] = request

    def take_fresh(self) -> list[Request]:
        """The requests that produced since the last call (still held), in that order: the writer
        files each once, not every held request every step."""
        fresh, self._fresh = self._fresh, {}
        held = self._held
        return [request for request_id, request in fresh.items() if held.get(request_id) is request]

    def first_token_at(self, request: Request) -> float | None:
        """The request's first token's time on the daemon's wall clock (None before it came)."""
        at = request.first_token_at
        return None if at is None else at + self.wall_offset

    def per_group(self) -> dict[tuple[str, RequestClass], int]:
        """How many this daemon holds of each (tenant, class) group: a claim tops each up. (Counted as
        requests come and go: a claim asks at every step new work is announced, and a pass over a
        thousand held requests each time was a step's cost of its own.)"""
        return dict(self._groups)

    def leases(self) -> dict[RequestId, int]:
        """Request -> the lease epoch this daemon holds it under."""
        return {rid: request.lease_epoch for rid, request in self._held.items()}
