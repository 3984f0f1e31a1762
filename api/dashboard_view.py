"""What `/dashboard` shows, as JSON: pure functions of what was read from the table and who asks.

Who sees what (the rule `fsched status` applies to OS users): an admin key
sees every tenant's jobs, online groups and requests; a tenant's key sees its
own, and other tenants only in aggregate (weights, entitled and served shares,
queued and running counts, tokens): never another tenant's jobs or requests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.jobstate import JobSummary
from fsched.core.ports.records import DaemonSummary, FirstTokens, OnlineGroup, TenantSummary, TenantTotals
from fsched.core.sched.attainment import merged
from fsched.core.sched.shares import entitled_shares, fairness
from fsched.core.types import RequestClass

CLASSES = [c.value for c in RequestClass]


@dataclass(slots=True, frozen=True)
class Facts:
    """One read of the table, the figures of one moment."""

    now: float
    jobs: Sequence[JobSummary]  # unfinished, in queue (every origin)
    tenants: Sequence[TenantSummary]
    daemons: Sequence[DaemonSummary]
    live: Sequence[DaemonSummary]
    totals: Sequence[TenantTotals]
    first_tokens: Mapping[RequestClass, FirstTokens]  # over the last minute
    listed: Sequence[JobSummary] = ()  # the jobs the viewer may see: files and batches
    online: Sequence[OnlineGroup] = ()  # the viewer's online groups
    served: Mapping[str, float] = field(default_factory=dict)  # the newest live daemon's


def stats_json(daemon: DaemonSummary) -> dict:
    """A heartbeat's figures as `fsched status --json` shows them."""
    return daemon.stats.to_json()


def entitled(tenants: Sequence[TenantSummary]) -> dict[str, float]:
    """Entitled shares of the tenants with work (every one's, as /metrics has them)."""
    active = {t.name for t in tenants if t.queued or t.running}
    return entitled_shares({t.name: t.weight for t in tenants}, active)


def queues(jobs: Sequence[JobSummary]) -> list[dict]:
    """Requests waiting and running per tenant and class, as /metrics' gauges count them."""
    waiting, running = Counter(), Counter()
    for job in jobs:
        group = (job.tenant, job.request_class.value)
        waiting[group] += job.counts.num_waiting
        running[group] += job.counts.num_running
    return [{"tenant": t, "class": c, "waiting": waiting[t, c], "running": running[t, c]}
            for t, c in sorted(set(waiting) | set(running))]


def ttft(first_tokens: Mapping[RequestClass, FirstTokens]) -> dict[str, dict]:
    """First-token p50 and p99 of each class, in the order of the classes."""
    return {c.value: {"count": f.count, "p50": f.p50_s, "p99": f.p99_s}
            for c in RequestClass if (f := first_tokens.get(c)) is not None}


def daemon_row(d: DaemonSummary, now: float) -> dict:
    state, age_s = d.state(now), d.heartbeat_age(now)
    s = stats_json(d) if state == "alive" else {}
    budget = s.get("kv_budget") or 0
    return {
        "id": d.id, "host": d.host, "device": d.device, "model": d.model, "state": state,
        "heartbeat_age_s": round(age_s, 1), "policy": s.get("policy"), "batch": s.get("batch"),
        "tok_s": s.get("tok_s"), "step_ms": s.get("step_ms"), "kv_tokens": s.get("kv_tokens"),
        "kv_budget": budget or None, "kv_use": (s.get("kv_tokens") or 0) / budget if budget else None,
        "preemptions": s.get("preemptions"),
    }


def preemption_cost(live: Sequence[DaemonSummary]) -> float | None:
    """KV tokens the live daemons' preemptions recomputed or parked over the tokens they computed."""
    computed = sum(d.stats.tokens_computed for d in live)
    spent = sum(d.stats.tokens_recomputed + d.stats.tokens_parked for d in live)
    return spent / computed if computed else None


def tenant_rows(facts: Facts) -> list[dict]:
    shares = entitled(facts.tenants)
    used: dict[str, Counter] = {}
    for t in facts.totals:
        c = used.setdefault(t.tenant, Counter())
        c.update(generated=t.generated_tokens, prompt=t.prompt_tokens, done=t.done, failed=t.failed,
                 cancelled=t.cancelled)
    slo = merged(d.stats.first_tokens for d in facts.live)
    rows = []
    for t in facts.tenants:
        active = bool(t.queued or t.running)
        c = used.get(t.name, Counter())
        rows.append({
            "name": t.name, "weight": t.weight, "active": active,
            "entitled_share": round(shares[t.name], 4), "served_share": facts.served.get(t.name),
            "queued": t.queued, "running": t.running, "active_jobs": t.active_jobs,
            "generated_tokens": c["generated"], "prompt_tokens": c["prompt"],
            "requests": {"done": c["done"], "failed": c["failed"], "cancelled": c["cancelled"]},
            # first tokens and those on target per class, over the live daemons (as /metrics counts them)
            "slo": {cls: {"first_tokens": n, "on_target": on}
                    for cls, (n, on) in slo.get(t.name, {}).items()},
        })
    return rows


def fairness_figure(facts: Facts) -> float | None:
    """Jain's index over the tenants with work of recently served over entitled share."""
    active = [t.name for t in facts.tenants if t.queued or t.running]
    return fairness(facts.served, {t.name: t.weight for t in facts.tenants}, active)


def job_row(job: JobSummary, now: float) -> dict:
    c = job.counts
    return {
        "id": job.id, "name": job.name, "tenant": job.tenant, "class": job.request_class.value,
        "origin": job.origin.value, "priority": job.priority, "state": job.state.value,
        "num_requests": c.num_requests, "num_done": c.num_done, "num_failed": c.num_failed,
        "num_cancelled": c.num_cancelled, "num_running": c.num_running, "num_waiting": c.num_waiting,
        "num_output_tokens": job.num_output_tokens,
        "progress": c.num_finished / c.num_requests if c.num_requests else 1.0,
        "age_s": round(max(0.0, now - job.submitted_at), 1),
    }


def online_row(g: OnlineGroup) -> dict:
    return {"tenant": g.tenant, "key_id": g.key_id, "requests": g.requests, "in_flight": g.in_flight,
            "done": g.done, "failed": g.failed, "cancelled": g.cancelled,
            "generated_tokens": g.generated_tokens, "recent": g.recent,
            "ttft_p50_s": g.ttft_p50_s, "ttft_p99_s": g.ttft_p99_s}


def why_waiting(row: Mapping, position: int) -> str:
    """Why a request runs or waits, in words (from the scheduler's standing of it)."""
    if row["state"] == "running":
        return f"running: {row.get('generated', 0):,} tokens so far"
    parts = [f"{_ordinal(position)} in line" + (" (preempted: resumes with its tokens)"
                                               if row["state"] == "preempted" else "")]
    if row.get("tier") == "precedence":
        parts.append(f"{row['class']} work of a tenant within its share: goes ahead of batch work")
    elif row.get("in_share", True):
        parts.append("ordered by its tenant's use over weight (lower first); the tenant is within its share")
    else:
        parts.append("its tenant is over its share while others wait: it goes after them")
    if row.get("late"):
        parts.append(f"past the {row['class']} first-token target")
    return "; ".join(parts)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def why_rows(requests: Sequence[Mapping], viewer: ApiKey) -> list[dict]:
    """The newest daemon's running and waiting requests the viewer may see, each with its reason."""
    out, waiting_position = [], 0
    for r in requests:
        if r["state"] != "running":
            waiting_position += 1
        if viewer.admin or r["tenant"] == viewer.tenant:
            out.append({"id": str(r["id"]), "tenant": r["tenant"], "class": r["class"],
                        "state": r["state"], "waited_s": r.get("waited_s", 0.0),
                        "generated": r.get("generated", 0), "tier": r.get("tier"),
                        "in_share": r.get("in_share", True), "late": r.get("late", False),
                        "why": why_waiting(r, waiting_position)})
    return out


def state_json(facts: Facts, viewer: ApiKey, history: Sequence[dict], since: float | None) -> dict:
    """The whole page's figures for `viewer`; `history` samples newer than `since` only."""
    newest = max(facts.live, key=lambda d: d.heartbeat_at) if facts.live else None
    daemons = [daemon_row(d, facts.now) for d in facts.daemons]
    alive = [d for d in daemons if d["state"] == "alive"]
    return {
        "viewer": {"tenant": viewer.tenant, "admin": viewer.admin, "key_id": viewer.id},
        "now": facts.now,
        "tenants": tenant_rows(facts),
        "queues": queues(facts.jobs),
        "daemons": daemons,
        "daemons_alive": len(alive),
        "engine": {"tok_s": sum(d["tok_s"] or 0 for d in alive),
                   "preemptions": sum(d["preemptions"] or 0 for d in alive),
                   "preemption_cost": preemption_cost(facts.live)},
        "fairness_jain": fairness_figure(facts),
        "ttft": ttft(facts.first_tokens),
        "jobs": [job_row(j, facts.now) for j in facts.listed],
        "online": [online_row(g) for g in facts.online],
        "why": why_rows(stats_json(newest).get("requests") or [], viewer) if newest else [],
        "history": [s for s in history if since is None or s["t"] > since],
    }
