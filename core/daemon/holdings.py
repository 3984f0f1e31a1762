"""The requests a daemon holds: their live records (core/sched/request.py), by id, in claim order.

A record is the one the engine and its scheduler run: the daemon's lease on
it, its first token's time and whether its output waits to be written are
fields of the same record, not a second copy.
"""

from __future__ import annotations

from collections.abc import Iterator

from fsched.core.sched.request import Request
from fsched.core.types import RequestClass, RequestId


class Holdings:
    """Held requests by id, in claim order."""

    def __init__(self) -> None:
        self._held: dict[RequestId, Request] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: RequestId) -> bool:
        return request_id in self._held

    def __iter__(self) -> Iterator[tuple[RequestId, Request]]:
        return iter(list(self._held.items()))

    def add(self, request: Request) -> None:
        self._held[request.id] = request

    def get(self, request_id: RequestId) -> Request | None:
        return self._held.get(request_id)

    def pop(self, request_id: RequestId) -> Request | None:
        return self._held.pop(request_id, None)

    def produced(self, request_id: RequestId, now: float) -> None:
        """A step produced a token for the request (if still held); `now` on the daemon's clock."""
        request = self._held.get(request_id)
        if request is not None:
            request.dirty = True
            if request.first_token_at is None:
                request.first_token_at = now

    def per_group(self) -> dict[tuple[str, RequestClass], int]:
        """How many this daemon holds of each (tenant, class) group: a claim tops each up."""
        counts: dict[tuple[str, RequestClass], int] = {}
        for request in self._held.values():
            group = (request.tenant, request.request_class)
            counts[group] = counts.get(group, 0) + 1
        return counts

    def leases(self) -> dict[RequestId, int]:
        """Request -> the lease epoch this daemon holds it under."""
        return {rid: request.lease_epoch for rid, request in self._held.items()}
