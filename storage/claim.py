"""The fair, atomic claim: queued requests -> running, leased to one daemon.

Each claim raises the request's lease epoch (the fencing token its writes
must name) and sets the lease's expiry on the database's clock.

Fair by construction: up to `per_group` for each (tenant, class) group, less
what the daemon already holds of it, taking a group's jobs by base priority
then age and each job's requests in input order. So one tenant's
50,000-line file never hides another tenant's work from the scheduler.

A claim costs a fixed number of statements however many jobs it takes from:
the jobs it takes whole (every online request is a job of one) are read in
one select, their rows moved in one update and their counters in one
executemany; only a job it takes part of is read with a limit of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from sqlalchemy import Connection, Float, bindparam, select, update

from fsched.core.jobs.jobstate import derive_job_state
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass
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
IN_CHUNK = 400  # ids a statement names at once (SQLite's older builds bind at most 999 parameters)

CANDIDATE_JOBS = (
    select(jobs.c.id, jobs.c.tenant, jobs.c["class"].label("request_class"), WAITING.label("waiting"))
    .where(jobs.c.state.not_in(FINISHED_JOB_STATES), jobs.c.cancel_requested_at.is_(None), WAITING > 0)
    .order_by(jobs.c.priority, jobs.c.id)
)
_QUEUED_ROWS = (
    select(requests, jobs.c.tenant, jobs.c["class"].label("request_class"), jobs.c.priority)
    .join(jobs, jobs.c.id == requests.c.job_id)
    .where(requests.c.state == RowState.QUEUED.value)
)
# The queued rows of whole jobs, and of one job up to a limit (both in input order).
ROWS_OF_JOBS = _QUEUED_ROWS.where(requests.c.job_id.in_(bindparam("b_jobs", expanding=True))).order_by(
    requests.c.job_id, requests.c.idx)
ROWS_OF_JOB = _QUEUED_ROWS.where(requests.c.job_id == bindparam("b_job")).order_by(requests.c.idx).limit(
    bindparam("b_want"))
JOBS_TO_LOCK = select(jobs).where(jobs.c.id.in_(bindparam("b_jobs", expanding=True))).order_by(jobs.c.id)
# On PostgreSQL the rows another daemon is claiming are skipped, not waited for, and the jobs locked.
LOCKING = {
    id(ROWS_OF_JOBS): ROWS_OF_JOBS.with_for_update(of=requests, skip_locked=True),
    id(ROWS_OF_JOB): ROWS_OF_JOB.with_for_update(of=requests, skip_locked=True),
    id(JOBS_TO_LOCK): JOBS_TO_LOCK.with_for_update(),
}
CLAIMED_JOB = (
    update(jobs)
    .where(jobs.c.id == bindparam("b_id"))
    .values(num_running=bindparam("b_running"), state=bindparam("b_state"), started_at=bindparam("b_started"))
)


def claim_requests(
    db: Database,
    now: float,
    owner: str,
    per_group: int,
    held: Mapping[Group, int],
    limit: int | None,
    lease_s: float,
    look_first: bool = True,
) -> list[Request]:
    """Claim for `owner`; see the module's docstring. `look_first`: a read before the write lock, which
    most calls end (they find nothing to take); a caller told of new work skips it."""
    if look_first:
        with db.read() as conn:
            candidates = conn.execute(CANDIDATE_JOBS).all()
        room = {(j.tenant, RequestClass(j.request_class)) for j in candidates}
        if all(per_group <= held.get(group, 0) for group in room):
            return []
    with db.write() as conn:
        wants = _wants(conn.execute(CANDIDATE_JOBS).all(), per_group, held, limit)
        if not wants:
            return []
        rows = _queued_rows(db, conn, wants)
        if not rows:
            return []
        lease = _lease_statement(db)
        for part in _chunks([row.id for row in rows]):
            conn.execute(lease, {"b_ids": part, "b_owner": owner, "b_lease_s": lease_s})
        _count_running(db, conn, rows, now)
        stored = read_logprobs(conn, [row.id for row in rows if row.num_logprobs])  # resumes
    return [claimed_request(row, stored.get(row.id, ())) for row in rows]


_LEASES: dict[str, object] = {}  # dialect -> the statement that leases rows (the database's clock)


def _lease_statement(db: Database):
    """Rows to `running`, leased to an owner until the database's clock plus the lease (built once)."""
    found = _LEASES.get(db.dialect)
    if found is None:
        found = _LEASES[db.dialect] = (
            update(requests)
            .where(requests.c.id.in_(bindparam("b_ids", expanding=True)))
            .values(
                state=RowState.RUNNING.value,
                lease_owner=bindparam("b_owner"),
                lease_epoch=requests.c.lease_epoch + 1,
                lease_expires_at=db.now() + bindparam("b_lease_s", type_=Float),
                attempts=requests.c.attempts + 1,
            )
        )
    return found


def _wants(candidates: Sequence, per_group: int, held: Mapping[Group, int], limit: int | None
           ) -> dict[int, tuple[int, bool]]:
    """job id -> (how many of its queued requests to take, whether that is all of them), in the
    claim's order: each group's room shared out among its jobs by priority then age."""
    room: dict[Group, int] = {}
    wants: dict[int, tuple[int, bool]] = {}
    taken = 0
    for job in candidates:
        group = (job.tenant, RequestClass(job.request_class))
        room.setdefault(group, per_group - held.get(group, 0))
        want = room[group] if limit is None else min(room[group], limit - taken)
        want = min(want, job.waiting)
        if want <= 0:
            continue
        wants[job.id] = (want, want >= job.waiting)
        room[group] -= want
        taken += want
    return wants


def _queued_rows(db: Database, conn: Connection, wants: Mapping[int, tuple[int, bool]]) -> list:
    """The rows to lease, in the claim's order: the whole jobs' in one select, the others a job at a
    time; each job's at most what it wants (its counters may lag a concurrent daemon's claim)."""
    whole = [job_id for job_id, (_, everything) in wants.items() if everything]
    by_job: dict[int, list] = {}
    for part in _chunks(whole):
        for row in conn.execute(_locking(db, ROWS_OF_JOBS), {"b_jobs": part}):
            by_job.setdefault(row.job_id, []).append(row)
    for job_id, (want, everything) in wants.items():
        if not everything:
            by_job[job_id] = conn.execute(_locking(db, ROWS_OF_JOB), {"b_job": job_id, "b_want": want}).all()
    return [row for job_id, (want, _) in wants.items() for row in by_job.get(job_id, ())[:want]]


def _locking(db: Database, query):
    return LOCKING[id(query)] if db.dialect == "postgresql" else query


def _count_running(db: Database, conn: Connection, rows: Sequence, now: float) -> None:
    """The claimed rows' jobs: their running counters up, started, their state derived (locked in id
    order on PostgreSQL: two daemons claiming never deadlock on jobs)."""
    per_job: dict[int, int] = {}
    for row in rows:
        per_job[row.job_id] = per_job.get(row.job_id, 0) + 1
    query = _locking(db, JOBS_TO_LOCK)
    writes = []
    for part in _chunks(sorted(per_job)):
        for job in conn.execute(query, {"b_jobs": part}):
            counts = replace(job_counts(job), num_running=job.num_running + per_job[job.id])
            cancelling = job.cancel_requested_at is not None
            state = derive_job_state(counts, started=True, cancel_requested=cancelling)
            writes.append({"b_id": job.id, "b_running": counts.num_running, "b_state": state.value,
                           "b_started": job.started_at or now})
    if writes:
        conn.execute(CLAIMED_JOB, writes)


def _chunks(ids: Sequence[int]) -> list[list[int]]:
    return [list(ids[i:i + IN_CHUNK]) for i in range(0, len(ids), IN_CHUNK)]
