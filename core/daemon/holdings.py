"""The requests a daemon holds: its lease on each, and what it has not written back yet."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from fsched.core.ports.records import ClaimedRequest
from fsched.core.types import RequestClass, RequestId


@dataclass(slots=True)
class Held:
    claimed: ClaimedRequest
    first_token_at: float | None = None
    dirty: bool = False  # tokens generated since the last write-back
    linked: bool = False  # a server hears its tokens over the daemon's link (core/daemon/link.py)

    @property
    def lease_epoch(self) -> int:
        return self.claimed.lease_epoch

    @property
    def latency_sensitive(self) -> bool:
        """Realtime and streaming output is written back every step; batch output, and output a server
        hears over the link already, less often."""
        return self.claimed.request_class is not RequestClass.BATCH and not self.linked


class Holdings:
    """Held requests by id, in claim order."""

    def __init__(self) -> None:
        self._held: dict[RequestId, Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, request_id: RequestId) -> bool:
        return request_id in self._held

    def __iter__(self) -> Iterator[tuple[RequestId, Held]]:
        return iter(list(self._held.items()))

    def add(self, claimed: ClaimedRequest) -> None:
        self._held[claimed.id] = Held(claimed)

    def get(self, request_id: RequestId) -> Held | None:
        return self._held.get(request_id)

    def pop(self, request_id: RequestId) -> Held | None:
        return self._held.pop(request_id, None)

    def produced(self, request_id: RequestId, now: float) -> None:
        """A step produced a token for the request (if still held)."""
        held = self._held.get(request_id)
        if held is not None:
            held.dirty = True
            if held.first_token_at is None:
                held.first_token_at = now

    def per_group(self) -> dict[tuple[str, RequestClass], int]:
        """How many this daemon holds of each (tenant, class) group: a claim tops each up."""
        counts: dict[tuple[str, RequestClass], int] = {}
        for held in self._held.values():
            group = (held.claimed.tenant, held.claimed.request_class)
            counts[group] = counts.get(group, 0) + 1
        return counts

    def leases(self) -> dict[RequestId, int]:
        """Request -> the lease epoch this daemon holds it under."""
        return {rid: held.lease_epoch for rid, held in self._held.items()}
