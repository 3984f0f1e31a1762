"""Reads of what happened lately: first-token latencies over a window, online requests in groups.

Both read an index range (`requests.first_token_at`, `jobs(origin, id)`), so their cost follows the
window or the online jobs, not the whole table.
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import case, func, select

from fsched.core.ports.records import FirstTokens, OnlineGroup
from fsched.core.sim.metrics import percentile
from fsched.core.types import JobOrigin, RequestClass
from fsched.storage.db import Database
from fsched.storage.rows import FINISHED_JOB_STATES, jobs, requests

# The window an online group's latency figures cover.
ONLINE_WINDOW_S = 300.0
INTERACTIVE = [o.value for o in JobOrigin if o.interactive]


def first_tokens(db: Database, since: float) -> dict[RequestClass, FirstTokens]:
    """First-token latency by class of the requests whose first token came after `since`."""
    with db.read() as conn:
        rows = conn.execute(
            select(jobs.c["class"], requests.c.first_token_at - requests.c.enqueued_at)
            .select_from(requests.join(jobs, jobs.c.id == requests.c.job_id))
            .where(requests.c.first_token_at > since)
        ).all()
    by_class: dict[RequestClass, list[float]] = defaultdict(list)
    for row in rows:
        by_class[RequestClass(row[0])].append(max(0.0, row[1]))
    return {c: FirstTokens(len(v), percentile(v, 50), percentile(v, 99)) for c, v in by_class.items()}


def online_groups(db: Database, since: float, tenant: str | None = None) -> list[OnlineGroup]:
    """Online and `generate` requests per (tenant, key): counts ever, in flight now, and first-token
    latency of those whose first token came after `since`; by tenant, then key."""
    unfinished = case((jobs.c.state.not_in(FINISHED_JOB_STATES), 1), else_=0)
    query = (
        select(jobs.c.tenant, jobs.c.key_id, func.count(), func.sum(unfinished),
               *(func.sum(c) for c in (jobs.c.num_done, jobs.c.num_failed, jobs.c.num_cancelled,
                                       jobs.c.num_output_tokens)),
               func.max(jobs.c.submitted_at))
        .where(jobs.c.origin.in_(INTERACTIVE)).group_by(jobs.c.tenant, jobs.c.key_id)
    )
    recent = (
        select(jobs.c.tenant, jobs.c.key_id, requests.c.first_token_at - requests.c.enqueued_at)
        .select_from(requests.join(jobs, jobs.c.id == requests.c.job_id))
        .where(requests.c.first_token_at > since, jobs.c.origin.in_(INTERACTIVE))
    )
    if tenant is not None:
        query, recent = query.where(jobs.c.tenant == tenant), recent.where(jobs.c.tenant == tenant)
    with db.read() as conn:
        rows, latencies = conn.execute(query).all(), conn.execute(recent).all()
    ttft: dict[tuple[str, str | None], list[float]] = defaultdict(list)
    for row in latencies:
        ttft[row[0], row[1]].append(max(0.0, row[2]))
    groups = []
    for row in rows:
        seen = ttft.get((row[0], row[1]), [])
        groups.append(OnlineGroup(row[0], row[1], *(int(v or 0) for v in row[2:8]), last_at=row[8],
                                  recent=len(seen), ttft_p50_s=percentile(seen, 50),
                                  ttft_p99_s=percentile(seen, 99)))
    return sorted(groups, key=lambda g: (g.tenant, g.key_id or ""))
