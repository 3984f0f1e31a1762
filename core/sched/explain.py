"""Why a request runs or waits, as Slurm's `sprio` explains a priority: pure, from the scheduler."""

from __future__ import annotations

from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestClass, RequestState

_BATCH = RequestClass.BATCH.band


def explain(scheduler: Scheduler, now: float, running_limit: int = 8, waiting_limit: int = 8) -> list[dict]:
    """Running requests, then the waiting ones in the order they would be admitted
    (each list capped, so a full batch does not hide the queue's head).

    Each: its class band; `tier` "precedence" (realtime or streaming work of a
    tenant within its share, or batch past its first-token target of such a
    tenant) or "share" (ordered by tenant score); `age_boost` 1 for batch
    promoted past its target (`aged_band` is then the band it competes at,
    ahead of fresh batch); base priority; how long it has waited; its
    tenant's weighted dominant use (the score: lower goes first) and whether
    the tenant is within its share. `level` is kept for readers of the old
    layout and is always 0.
    """
    stand = scheduler.standings(now)
    policy = scheduler.policy
    target = scheduler.config.batch_target_s

    def row(r) -> dict:
        band = r.cls.band
        waiting = r.state is not RequestState.RUNNING
        standing = stand.get(r.tenant)
        in_share = standing is None or standing.in_share
        promoted = waiting and band == _BATCH and now - r.arrival >= target
        tier = "precedence" if in_share and (band < _BATCH or promoted) else "share"
        return {
            "id": r.id,
            "tenant": r.tenant,
            "class": r.cls.value,
            "state": "running" if not waiting else r.state.value,
            "band": band,
            "aged_band": band,
            "age_boost": int(promoted),
            "level": 0,
            "priority": r.priority,
            "waited_s": round(max(0.0, now - r.wait_since), 3) if waiting else 0.0,
            "generated": r.generated,
            "tenant_share": round(standing.score if standing else 0.0, 6),
            "in_share": in_share,
            "tier": tier,
        }

    running = sorted(scheduler.running.values(), key=lambda r: policy.running_rank(r, stand))
    waiting = sorted(scheduler.waiting(), key=lambda r: policy.rank(r, now, stand))
    return [row(r) for r in [*running[:running_limit], *waiting[:waiting_limit]]]
