"""Why a request runs or waits, as Slurm's `sprio` explains a priority: pure, from the scheduler."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fsched.core.types import RequestClass, RequestId, RequestStatus

if TYPE_CHECKING:
    from fsched.core.sched.scheduler import Scheduler

_BATCH = RequestClass.BATCH.band


@dataclass(slots=True, frozen=True)
class RequestStanding:
    """One running or waiting request, and why it is where it is.

    `tier` is "precedence" (realtime or streaming work of a tenant whose
    recent realtime and streaming use is within its share) or "share"
    (ordered by tenant score); `late`: past its class's first-token target;
    `tenant_share`: its tenant's weighted dominant use (the score: lower goes
    first); `in_share`: whether the tenant is within its share.
    """

    id: RequestId
    tenant: str
    request_class: RequestClass
    status: RequestStatus  # waiting, running or preempted
    priority: int
    waited_s: float
    generated: int
    tenant_share: float
    in_share: bool = True
    tier: str = "share"
    late: bool = False

    @property
    def band(self) -> int:
        return self.request_class.band

    def to_json(self) -> dict[str, Any]:
        """The standing as a daemon's heartbeat and `fsched status --json` carry it. `aged_band`
        (= band), `age_boost` and `level` (0) are kept for readers of the earlier layout."""
        return {
            "id": self.id, "tenant": self.tenant, "class": self.request_class.value,
            "state": self.status.word, "band": self.band, "aged_band": self.band, "age_boost": 0, "level": 0,
            "priority": self.priority, "waited_s": self.waited_s, "generated": self.generated,
            "tenant_share": self.tenant_share, "in_share": self.in_share, "tier": self.tier,
            "late": self.late,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestStanding:
        return cls(
            id=str(data["id"]), tenant=data["tenant"], request_class=RequestClass(data["class"]),
            status=RequestStatus.of_word(data["state"]), priority=int(data["priority"]),
            waited_s=float(data["waited_s"]), generated=int(data.get("generated", 0)),
            tenant_share=float(data["tenant_share"]), in_share=bool(data.get("in_share", True)),
            tier=data.get("tier", "share"), late=bool(data.get("late", False)),
        )


def explain(scheduler: Scheduler, now: float, running_limit: int = 8,
            waiting_limit: int = 8) -> list[RequestStanding]:
    """Running requests, then the waiting ones in the order they would be admitted
    (each list capped, so a full batch does not hide the queue's head)."""
    stand = scheduler.standings(now)
    policy = scheduler.policy
    config = scheduler.config

    def row(r) -> RequestStanding:
        waiting = r.status is not RequestStatus.RUNNING
        standing = stand.get(r.tenant)
        precedence = standing is None or standing.precedence
        return RequestStanding(
            id=r.id,
            tenant=r.tenant,
            request_class=r.request_class,
            status=r.status,
            priority=r.priority,
            waited_s=round(max(0.0, now - r.wait_since), 3) if waiting else 0.0,
            generated=r.generated,
            tenant_share=round(standing.score if standing else 0.0, 6),
            in_share=standing is None or standing.in_share,
            tier="precedence" if r.request_class.band < _BATCH and precedence else "share",
            late=waiting and r.generated == 0 and now - r.arrival > config.target_s(r.request_class),
        )

    running = sorted(scheduler.running.values(), key=lambda r: policy.running_rank(r, stand, now))
    waiting = sorted(scheduler.waiting(), key=lambda r: policy.rank(r, now, stand))
    return [row(r) for r in [*running[:running_limit], *waiting[:waiting_limit]]]
