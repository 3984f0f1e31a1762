"""Pure builders: a status snapshot in, JSON-ready dicts out (no rich: `--json` stays quick)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fsched.cli.common import iso_time
from fsched.core.jobs.jobstate import JobSummary
from fsched.core.ports.records import DaemonSummary, OnlineGroup, TenantSummary, newest_live_daemon
from fsched.core.sched.attainment import merged
from fsched.core.sched.shares import entitled_shares, fairness


@dataclass(slots=True, frozen=True)
class StatusSnapshot:
    jobs: list[JobSummary]
    tenants: list[TenantSummary]
    daemons: list[DaemonSummary]
    now: float
    online: list[OnlineGroup] = field(default_factory=list)  # online requests, per tenant and key


def tenant_entitlements(tenants: list[TenantSummary]) -> dict[str, float | None]:
    """Each tenant's entitled share: its weight over the weights of the tenants with work.

    A tenant without work is shown the share it would get by submitting now.
    When no tenant has work nobody is entitled to anything: every share is
    None (a dash in the view, null in JSON), not a misleading 100% each.
    """
    weights = {t.name: t.weight for t in tenants}
    active = {t.name for t in tenants if t.queued or t.running}
    if not active:
        return dict.fromkeys(weights)
    return entitled_shares(weights, active)


def job_json(job: JobSummary) -> dict:
    c = job.counts
    return {
        "id": job.id,
        "name": job.name,
        "tenant": job.tenant,
        "class": job.request_class.value,
        "priority": job.priority,
        "state": job.state.value,
        "num_requests": c.num_requests,
        "num_done": c.num_done,
        "num_failed": c.num_failed,
        "num_cancelled": c.num_cancelled,
        "num_running": c.num_running,
        "num_waiting": c.num_waiting,
        "num_output_tokens": job.num_output_tokens,
        "submitted_at": iso_time(job.submitted_at),
        "started_at": iso_time(job.started_at),
        "finished_at": iso_time(job.finished_at),
    }


def tenant_json(tenant: TenantSummary, entitled: float | None) -> dict:
    return {
        "name": tenant.name,
        "weight": tenant.weight,
        "entitled_share": None if entitled is None else round(entitled, 4),
        "active_jobs": tenant.active_jobs,
        "queued": tenant.queued,
        "running": tenant.running,
    }


def slo_json(first_tokens: dict[str, list[int]]) -> dict:
    """A tenant's first tokens, those on target and their ratio, per class."""
    return {c: {"first_tokens": n, "on_target": on, "attainment": round(on / n, 4) if n else None}
            for c, (n, on) in first_tokens.items()}


def live_first_tokens(snapshot: StatusSnapshot) -> dict[str, dict[str, list[int]]]:
    """First tokens and those on target, per tenant and class, summed over the live daemons (each
    since it started)."""
    return merged(d.stats.first_tokens for d in snapshot.daemons if d.alive(snapshot.now))


def live_fairness(snapshot: StatusSnapshot) -> float | None:
    """Jain's index over the tenants with work of recently served over entitled share (the newest
    live daemon's decayed use); None without a live daemon or a tenant with work."""
    newest = newest_live_daemon(snapshot.daemons, snapshot.now)
    if newest is None:
        return None
    active = [t.name for t in snapshot.tenants if t.queued or t.running]
    return fairness(newest.stats.served_share, {t.name: t.weight for t in snapshot.tenants}, active)


def daemon_json(daemon: DaemonSummary, now: float) -> dict:
    return {
        "id": daemon.id,
        "host": daemon.host,
        "pid": daemon.pid,
        "device": daemon.device,
        "model": daemon.model,
        "started_at": iso_time(daemon.started_at),
        "heartbeat_age_s": round(daemon.heartbeat_age(now), 3),
        "alive": daemon.alive(now),
        "state": daemon.state(now),
        "stats": daemon.stats.to_json(),
    }


def status_json(snapshot: StatusSnapshot) -> dict:
    entitled = tenant_entitlements(snapshot.tenants)
    slo = live_first_tokens(snapshot)
    jain = live_fairness(snapshot)
    return {
        "jobs": [job_json(j) for j in snapshot.jobs],
        "tenants": [{**tenant_json(t, entitled[t.name]), "slo": slo_json(slo.get(t.name, {}))}
                    for t in snapshot.tenants],
        "fairness_jain": None if jain is None else round(jain, 4),
        "daemons": [daemon_json(d, snapshot.now) for d in snapshot.daemons],
        "online": [online_json(g) for g in snapshot.online],
    }


def online_json(group: OnlineGroup) -> dict:
    return {
        "tenant": group.tenant, "key_id": group.key_id, "requests": group.requests,
        "in_flight": group.in_flight, "done": group.done, "failed": group.failed,
        "cancelled": group.cancelled, "generated_tokens": group.generated_tokens,
        "last_at": iso_time(group.last_at), "recent": group.recent,
        "ttft_p50_s": _rounded(group.ttft_p50_s), "ttft_p99_s": _rounded(group.ttft_p99_s),
    }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)
