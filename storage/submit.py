"""Storing submitted jobs: tenants created on first use, the queue limit, the rows in chunks.

Functions of an open write transaction; `SqlCatalogStore.submit` runs them
all in one, so a submit lands whole or not at all.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from itertools import islice

from sqlalchemy import Connection, bindparam, func, literal, select, union_all
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fsched.core.faults import crash_point
from fsched.core.ports.records import JobSubmission, QueueFull
from fsched.core.types import JobState
from fsched.storage.models import ApiKeyRow
from fsched.storage.rows import FINISHED_JOB_STATES, UNFINISHED, RowState, jobs, requests, tenants

INSERT_CHUNK = 5_000

# Built once: every online request runs these (a new statement each time cost more than its execution).
_NAMES = bindparam("b_names", expanding=True)
TENANTS_LOCKED = select(tenants.c.name).where(tenants.c.name.in_(_NAMES)).with_for_update()
EXISTING_TENANTS = select(tenants.c.name).where(tenants.c.name.in_(_NAMES))
UNFINISHED_BY_TENANT = (
    select(jobs.c.tenant, func.sum(UNFINISHED))
    .where(jobs.c.tenant.in_(_NAMES), jobs.c.state.not_in(FINISHED_JOB_STATES))
    .group_by(jobs.c.tenant)
)
_KEYS = ApiKeyRow.__table__
_KEY_IDS = bindparam("b_key_ids", expanding=True)
# The tenants there and the keys usable, in one statement: a round trip more in the group commit's
# transaction, which submits wait on one after the other, was measured adding to every one under load.
TENANTS_AND_UNREVOKED_KEYS = union_all(
    select(tenants.c.name, literal(False).label("is_key")).where(tenants.c.name.in_(_NAMES)),
    select(_KEYS.c.id, literal(True)).where(_KEYS.c.id.in_(_KEY_IDS), _KEYS.c.revoked_at.is_(None)))
# The same with the tenants' rows locked as they are read (`unfinished_of`'s lock): one round trip
# fewer again, on PostgreSQL a wait on the server less for every request of a group commit.
_LOCKED = select(tenants.c.name).where(tenants.c.name.in_(_NAMES)).with_for_update().cte("locked")
TENANTS_LOCKED_AND_UNREVOKED_KEYS = union_all(
    select(_LOCKED.c.name, literal(False).label("is_key")),
    select(_KEYS.c.id, literal(True)).where(_KEYS.c.id.in_(_KEY_IDS), _KEYS.c.revoked_at.is_(None)))
JOB_INSERT = jobs.insert().returning(jobs.c.id)
# Several jobs in one statement (SQLAlchemy's "insertmanyvalues"), their ids in the parameters' order.
JOBS_INSERT = jobs.insert().returning(jobs.c.id, sort_by_parameter_order=True)
REQUESTS_INSERT = requests.insert()


def check_queue_limit(conn: Connection, submissions: Sequence[JobSubmission], limit: int) -> None:
    """QueueFull when a tenant's unfinished requests would go over `limit`."""
    adding = Counter()
    for submission in submissions:
        adding[submission.tenant] += len(submission.requests)
    have = unfinished_of(conn, set(adding))
    for tenant in sorted(adding):
        if have[tenant] + adding[tenant] > limit:
            raise QueueFull(tenant, have[tenant], adding[tenant], limit)


def unfinished_of(conn: Connection, names: set[str]) -> Counter:
    """Each tenant's unfinished requests, its row locked: concurrent submits of one tenant take turns
    on PostgreSQL (SQLite's BEGIN IMMEDIATE already serialises writers)."""
    conn.execute(TENANTS_LOCKED, {"b_names": sorted(names)})
    return unfinished_of_locked(conn, names)


def unfinished_of_locked(conn: Connection, names: set[str]) -> Counter:
    """Each tenant's unfinished requests, the tenants' rows locked by an earlier statement of the
    transaction (on PostgreSQL a statement sees what was committed before it began: the count must
    come after the lock, not with it)."""
    return Counter({tenant: int(n or 0) for tenant, n in conn.execute(
        UNFINISHED_BY_TENANT, {"b_names": sorted(names)}).all()})


def lock_tenants(conn: Connection, names: set[str]) -> None:
    if names:
        conn.execute(TENANTS_LOCKED, {"b_names": sorted(names)})


def tenants_and_unrevoked_keys(conn: Connection, names: set[str], key_ids: set[str],
                               lock: bool = False) -> tuple[set[str], set[str]]:
    """Those of the tenants that exist, and those of the keys that are in the table and not revoked,
    read inside the storing transaction: a key revoked before its request's row would be stored
    keeps the row out. With `lock`, the tenants found are locked as `unfinished_of` locks them."""
    statement = TENANTS_LOCKED_AND_UNREVOKED_KEYS if lock else TENANTS_AND_UNREVOKED_KEYS
    found = conn.execute(statement, {"b_names": sorted(names), "b_key_ids": sorted(key_ids)})
    existing, usable = set(), set()
    for name, is_key in found:
        (usable if is_key else existing).add(name)
    return existing, usable


def create_missing_tenants(conn: Connection, dialect: str, names: set[str], now: float,
                           existing: set[str] | None = None) -> set[str]:
    """Create the tenants not there yet (weight 1; `existing`: those there, read when not given);
    return those this call created."""
    if existing is None:
        existing = set(conn.execute(EXISTING_TENANTS, {"b_names": sorted(names)}).scalars())
    missing = names - existing
    if not missing:
        return set()
    # ON CONFLICT DO NOTHING: two first submits of one new tenant at once (on
    # PostgreSQL both can pass the check above) both succeed; one creates it.
    insert = postgresql_insert if dialect == "postgresql" else sqlite_insert
    created = conn.execute(
        insert(tenants)
        .values([{"name": name, "weight": 1.0, "created_at": now} for name in sorted(missing)])
        .on_conflict_do_nothing(index_elements=["name"])
        .returning(tenants.c.name)
    ).scalars()
    return set(created)


def insert_job(conn: Connection, submission: JobSubmission, now: float) -> int:
    """The job's row, then its requests in chunks; return the job's id."""
    job_id = conn.execute(JOB_INSERT, _job_row(submission, now)).scalar_one()
    rows = (_request_row(job_id, idx, spec, now) for idx, spec in enumerate(submission.requests))
    while chunk := list(islice(rows, INSERT_CHUNK)):
        conn.execute(REQUESTS_INSERT, chunk)
        crash_point("mid_submit")
    return job_id


def insert_jobs(conn: Connection, submissions: Sequence[JobSubmission], now: float) -> list[int]:
    """Small jobs (a group commit's online requests) in two statements whatever their number, not two
    each: their rows, then all their requests; return their ids, in order. Measured at 1,024 streams
    of 8-token requests, the statements one job each were an eighth of serve's CPU."""
    if not submissions:
        return []
    rows = [_job_row(s, now) for s in submissions]
    if conn.dialect.name == "sqlite":
        # SQLite numbers a statement's rows in the order of its VALUES (each one more than the largest
        # id before it); SQLAlchemy does not assume it, and asked for that order inserts them one a
        # statement. Ascending ids are the submissions' order.
        job_ids = sorted(conn.execute(JOB_INSERT, rows).scalars())
    else:
        job_ids = list(conn.execute(JOBS_INSERT, rows).scalars())
    conn.execute(REQUESTS_INSERT, [_request_row(job_id, idx, spec, now)
                                   for job_id, s in zip(job_ids, submissions, strict=True)
                                   for idx, spec in enumerate(s.requests)])
    crash_point("mid_submit")
    return job_ids


def _job_row(submission: JobSubmission, now: float) -> dict:
    return {
        "tenant": submission.tenant,
        "class": submission.request_class.value,
        "priority": submission.priority,
        "name": submission.name,
        "origin": submission.origin.value,
        "key_id": submission.key_id,
        "state": JobState.QUEUED.value,
        "num_requests": len(submission.requests),
        "num_done": 0,
        "num_failed": 0,
        "num_cancelled": 0,
        "num_running": 0,
        "num_output_tokens": 0,
        "num_prompt_tokens": 0,
        "submitted_at": now,
    }


def _request_row(job_id: int, idx: int, spec, now: float) -> dict:
    return {
        "job_id": job_id,
        "idx": idx,
        "custom_id": spec.custom_id,
        "choice": spec.choice,
        "answer": spec.answer.to_json() or None,
        "endpoint": spec.endpoint.value,
        "prompt": spec.prompt,
        "messages": [m.to_json() for m in spec.messages] if spec.messages else None,
        "render": spec.render.to_json(),
        "params": _with_seed(spec.params).to_json(),
        "max_tokens": spec.params.max_tokens,
        "model": spec.model,
        "state": RowState.QUEUED.value,
        "output_tokens": [],
        "output_text": "",
        "num_output_tokens": 0,
        "attempts": 0,
        "enqueued_at": now,
        "lease_epoch": 0,
    }


def _with_seed(params):
    """Every stored request has a seed, so its sampling replays after a restart."""
    return params if params.seed is not None else replace(params, seed=secrets.randbits(63))
