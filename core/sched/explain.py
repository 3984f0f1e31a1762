"""Why a request runs or waits, as Slurm's `sprio` explains a priority: pure, from the scheduler."""

from __future__ import annotations

from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass, RequestState

_BATCH = RequestClass.BATCH.band


def explain(scheduler: Scheduler, now: float, running_limit: int = 8, waiting_limit: int = 8) -> list[dict]:
    """Running requests, then the waiting ones in the order they would be admitted
    (each list capped, so a full batch does not hide the queue's head).

    Each: its class band; `tier` "precedence" (realtime or streaming work of a
    tenant whose recent realtime and streaming use is within its share) or
    "share" (ordered by tenant score); base priority; how long it has waited;
    whether it is past its class's first-token target (`late`); its tenant's
    weighted dominant use (the score: lower goes first) and whether the
    tenant is within its share. `aged_band` (= band), `age_boost` and `level`
    (0) are kept for readers of the earlier layout.
    """
    stand = scheduler.standings(now)
    policy = scheduler.policy
    config = scheduler.config

    def row(r) -> dict:
        band = r.request_class.band
        waiting = r.state is not RequestState.RUNNING
        standing = stand.get(r.tenant)
        in_share = standing is None or standing.in_share
        precedence = standing is None or standing.precedence
        tier = "precedence" if band < _BATCH and precedence else "share"
        return {
            "id": r.id,
            "tenant": r.tenant,
            "class": r.request_class.value,
            "state": "running" if not waiting else r.state.value,
            "band": band,
            "aged_band": band,
            "age_boost": 0,
            "level": 0,
            "priority": r.priority,
            "waited_s": round(max(0.0, now - r.wait_since), 3) if waiting else 0.0,
            "generated": r.generated,
            "tenant_share": round(standing.score if standing else 0.0, 6),
            "in_share": in_share,
            "tier": tier,
            "late": waiting and r.generated == 0 and now - r.arrival > config.target_s(r.request_class),
        }

    running = sorted(scheduler.running.values(), key=lambda r: policy.running_rank(r, stand))
    waiting = sorted(scheduler.waiting(), key=lambda r: policy.rank(r, now, stand))
    return [row(r) for r in [*running[:running_limit], *waiting[:waiting_limit]]]
