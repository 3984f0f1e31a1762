"""Why a request runs or waits, as Slurm's `sprio` explains a priority: pure, from the scheduler."""

from __future__ import annotations

from fsched.core.sched.policy import aged
from fsched.core.sched.scheduler import Scheduler
from fsched.core.types import RequestState


def explain(scheduler: Scheduler, now: float, running_limit: int = 8, waiting_limit: int = 8) -> list[dict]:
    """Running requests, then the waiting ones in the order they would be admitted
    (each list capped, so a full batch does not hide the queue's head).

    Each: its class band, the band it competes at after aging (and the boost
    that aging gave), its MLFQ level, base priority, how long it has aged
    (waited since it, or its group, last ran), and its tenant's weighted dominant share (the DRF
    score: lower goes first).
    """
    tenants = {r.tenant for r in scheduler.running.values()} | {r.tenant for r in scheduler.waiting()}
    scores = scheduler.meter.scores(tenants, now) if tenants else {}
    aging_s = scheduler.config.aging_s
    policy = scheduler.policy

    def row(r) -> dict:
        band = r.cls.band
        waiting = r.state is not RequestState.RUNNING
        waited = max(0.0, now - policy.aging_since(r)) if waiting else 0.0
        aged_band, level, priority = aged(band, r.level, r.priority, waited, aging_s)
        return {
            "id": r.id,
            "tenant": r.tenant,
            "class": r.cls.value,
            "state": "running" if not waiting else r.state.value,
            "band": band,
            "aged_band": aged_band,
            "age_boost": band - aged_band,
            "level": level,
            "priority": priority,
            "waited_s": round(waited, 3),
            "generated": r.generated,
            "tenant_share": round(scores.get(r.tenant, 0.0), 6),
        }

    running = sorted(scheduler.running.values(), key=lambda r: policy.running_rank(r, scores))
    waiting = sorted(scheduler.waiting(), key=lambda r: policy.rank(r, now, scores))
    return [row(r) for r in [*running[:running_limit], *waiting[:waiting_limit]]]
