"""The fair, atomic claim: queued requests -> running, leased to one daemon.

Each claim raises the request's lease epoch (the fencing token its writes
must name) and sets the lease's expiry on the database's clock.

Fair by construction: up to `per_group` for each (tenant, class) group, less
what the daemon already holds of it, taking a group's jobs by base priority
then age and each job's requests in input order. So one tenant's
50,000-line file never hides another tenant's work from the scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from sqlalchemy import Connection, select, update

from fsched.core.sched.request import Request
from fsched.core.types import RequestClass
from fsched.storage.counters import lock_job, store_counts
from fsched.storage.db import Database
from fsched.storage.logprobs import read as read_logprobs
from fsched.storage.rows import (
    FINISHED_JOB_STATES,
    WAITING,
    RowState,
    claimed_request,
    job_counts,
    jobs,
    requests,
)

Group = tuple[str, RequestClass]

CANDIDATE_JOBS = (
    select(jobs.c.id, jobs.c.tenant, jobs.c["class"].label("request_class"))
    .where(jobs.c.state.not_in(FINISHED_JOB_STATES), jobs.c.cancel_requested_at.is_(None), WAITING > 0)
    .order_by(jobs.c.priority, jobs.c.id)
)


def claim_requests(
    db: Database,
    now: float,
    owner: str,
    per_group: int,
    held: Mapping[Group, int],
    limit: int | None,
    lease_s: float,
) -> list[Request]:
    """Claim for `owner`; see the module's docstring."""
    # A read first: most calls find nothing to take, and take no write lock.
    with db.read() as conn:
        candidates = conn.execute(CANDIDATE_JOBS).all()
    room = {(j.tenant, RequestClass(j.request_class)) for j in candidates}
    if all(per_group <= held.get(group, 0) for group in room):
        return []
    claimed: list = []
    with db.write() as conn:
        room: dict[Group, int] = {}
        for job in conn.execute(CANDIDATE_JOBS).all():
            group = (job.tenant, RequestClass(job.request_class))
            room.setdefault(group, per_group - held.get(group, 0))
            want = room[group] if limit is None else min(room[group], limit - len(claimed))
            if want <= 0:
                continue
            rows = _claim_from_job(db, conn, job.id, want, owner, lease_s, now)
            room[group] -= len(rows)
            claimed.extend(rows)
        stored = read_logprobs(conn, [row.id for row in claimed if row.num_logprobs])  # resumes
    return [claimed_request(row, stored.get(row.id, ())) for row in claimed]


def _claim_from_job(
    db: Database, conn: Connection, job_id: int, want: int, owner: str, lease_s: float, now: float
) -> list:
    """Lease up to `want` of one job's queued requests, in input order; the job's counters follow."""
    query = (
        select(requests, jobs.c.tenant, jobs.c["class"].label("request_class"), jobs.c.priority)
        .join(jobs, jobs.c.id == requests.c.job_id)
        .where(requests.c.job_id == job_id, requests.c.state == RowState.QUEUED.value)
        .order_by(requests.c.idx)
        .limit(want)
    )
    if db.dialect == "postgresql":
        query = query.with_for_update(of=requests, skip_locked=True)
    rows = conn.execute(query).all()
    if not rows:
        return []
    conn.execute(
        update(requests)
        .where(requests.c.id.in_([row.id for row in rows]))
        .values(
            state=RowState.RUNNING.value,
            lease_owner=owner,
            lease_epoch=requests.c.lease_epoch + 1,
            lease_expires_at=db.now() + lease_s,
            attempts=requests.c.attempts + 1,
        )
    )
    locked = lock_job(conn, db.dialect, job_id)
    counts = replace(job_counts(locked), num_running=locked.num_running + len(rows))
    store_counts(conn, locked, counts, now, started_at=locked.started_at or now)
    return rows
