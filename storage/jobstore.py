"""SqlJobStore: the JobStore protocol over SQLAlchemy Core (SQLite or PostgreSQL).

Every method is one transaction. Writers keep the per-job counters in step
with the request rows they count, and derive the job's state with the core's
pure `derive_job_state`, so there is one rule for it.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from itertools import islice

from sqlalchemy import Connection, Float, bindparam, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fsched.core.faults import crash_point
from fsched.core.jobs.jobstate import JobCounts, derive_job_state
from fsched.core.jobs.limits import DEFAULT_MAX_QUEUED_PER_TENANT
from fsched.core.jobs.tenants import validate_tenant_name, validate_weight
from fsched.core.store import (
    CancelOutcome,
    ClaimedRequest,
    Completion,
    DaemonSummary,
    JobSubmission,
    JobSummary,
    PeerUsage,
    QueueFull,
    RequestProgress,
    RequestResult,
    RequestTiming,
    StoreError,
    SubmittedJob,
    TenantBusy,
    TenantExists,
    TenantSummary,
    TokenUpdate,
    UnknownJob,
    UnknownTenant,
)
from fsched.core.types import JobState, RequestClass, RequestState
from fsched.storage.db import Database
from fsched.storage.models import Daemon, DaemonUsage, Job, Request, Tenant
from fsched.storage.schema import ensure_schema

jobs = Job.__table__
requests = Request.__table__
tenants = Tenant.__table__
daemons = Daemon.__table__
daemon_usage = DaemonUsage.__table__

FINISHED_JOB_STATES = [s.value for s in JobState if s.finished]
WAITING_REQUEST_STATES = [RequestState.QUEUED.value, RequestState.PREEMPTED.value]
INSERT_CHUNK = 5_000
RESULTS_BATCH = 1_000
USAGE_KEPT_S = 86_400.0

# The daemon's hot writes, built once and run as executemany: building an
# UPDATE per row cost more than executing it.
FLUSH_TOKENS = (
    update(requests)
    .where(requests.c.id == bindparam("b_id"))
    .values(
        output_tokens=bindparam("b_tokens", type_=requests.c.output_tokens.type),
        output_text=bindparam("b_text"),
        num_output_tokens=bindparam("b_num"),
        first_token_at=func.coalesce(requests.c.first_token_at, bindparam("b_first", type_=Float)),
    )
)
FINISH_REQUEST = (
    update(requests)
    .where(requests.c.id == bindparam("b_id"))
    .values(
        state=bindparam("b_state"),
        output_tokens=bindparam("b_tokens", type_=requests.c.output_tokens.type),
        output_text=bindparam("b_text"),
        num_output_tokens=bindparam("b_num"),
        finish_reason=bindparam("b_reason"),
        prompt_tokens=bindparam("b_prompt"),
        model=bindparam("b_model"),
        error=bindparam("b_error"),
        finished_at=bindparam("b_now", type_=Float),
        lease_owner=None,
        lease_expires_at=None,
        first_token_at=func.coalesce(requests.c.first_token_at, bindparam("b_first", type_=Float)),
    )
)


class SqlJobStore:
    def __init__(self, db: Database | str | None = None, clock=time.time):
        self.db = db if isinstance(db, Database) else Database(db)
        self.clock = clock
        ensure_schema(self.db)

    def file_owner(self) -> int | None:
        """The OS user id that owns the SQLite file (an fsched admin of it); None on PostgreSQL."""
        import os

        from sqlalchemy.engine import make_url

        if self.db.dialect != "sqlite":
            return None
        return os.stat(make_url(self.db.url).database).st_uid

    # -- submit ---------------------------------------------------------------

    def submit(
        self,
        submissions: Sequence[JobSubmission],
        max_queued_per_tenant: int = DEFAULT_MAX_QUEUED_PER_TENANT,
    ) -> list[SubmittedJob]:
        """Store every job and all its requests in one transaction, or nothing.

        QueueFull when a tenant's unfinished requests would go over
        `max_queued_per_tenant`: counted inside the transaction, so two
        concurrent submits cannot both slip under the limit.
        """
        now = self.clock()
        for submission in submissions:
            validate_tenant_name(submission.tenant)
        submitted = []
        with self.db.write() as conn:
            created = self._create_missing_tenants(conn, {s.tenant for s in submissions}, now)
            self._check_queue_limit(conn, submissions, max_queued_per_tenant)
            for submission in submissions:
                job_id = self._insert_job(conn, submission, now)
                submitted.append(
                    SubmittedJob(
                        job_id=job_id,
                        num_requests=len(submission.parsed.requests),
                        tenant=submission.tenant,
                        request_class=submission.request_class,
                        tenant_created=submission.tenant in created,
                    )
                )
        return submitted

    def _check_queue_limit(self, conn: Connection, submissions: Sequence[JobSubmission], limit: int) -> None:
        adding = Counter()
        for submission in submissions:
            adding[submission.tenant] += len(submission.parsed.requests)
        # Lock the tenants' rows: concurrent submits of one tenant take turns
        # on PostgreSQL (SQLite's BEGIN IMMEDIATE already serialises writers).
        conn.execute(select(tenants.c.name).where(tenants.c.name.in_(adding)).with_for_update())
        unfinished = jobs.c.num_requests - jobs.c.num_done - jobs.c.num_failed - jobs.c.num_cancelled
        have = dict(
            conn.execute(
                select(jobs.c.tenant, func.sum(unfinished))
                .where(jobs.c.tenant.in_(adding), jobs.c.state.not_in(FINISHED_JOB_STATES))
                .group_by(jobs.c.tenant)
            ).all()
        )
        for tenant in sorted(adding):
            if int(have.get(tenant) or 0) + adding[tenant] > limit:
                raise QueueFull(tenant, int(have.get(tenant) or 0), adding[tenant], limit)

    def _create_missing_tenants(self, conn: Connection, names: set[str], now: float) -> set[str]:
        existing = set(conn.execute(select(tenants.c.name).where(tenants.c.name.in_(names))).scalars())
        missing = names - existing
        if not missing:
            return set()
        # ON CONFLICT DO NOTHING: two first submits of one new tenant at once (on
        # PostgreSQL both can pass the check above) both succeed; one creates it.
        insert = postgresql_insert if self.db.dialect == "postgresql" else sqlite_insert
        created = conn.execute(
            insert(tenants)
            .values([{"name": name, "weight": 1.0, "created_at": now} for name in sorted(missing)])
            .on_conflict_do_nothing(index_elements=["name"])
            .returning(tenants.c.name)
        ).scalars()
        return set(created)

    def _insert_job(self, conn: Connection, submission: JobSubmission, now: float) -> int:
        specs = submission.parsed.requests
        job_id = conn.execute(
            jobs.insert()
            .values(
                tenant=submission.tenant,
                **{"class": submission.request_class.value},
                priority=submission.priority,
                name=submission.name,
                state=JobState.QUEUED.value,
                num_requests=len(specs),
                num_done=0,
                num_failed=0,
                num_cancelled=0,
                num_running=0,
                num_output_tokens=0,
                submitted_at=now,
            )
            .returning(jobs.c.id)
        ).scalar_one()
        rows = (
            {
                "job_id": job_id,
                "idx": idx,
                "custom_id": spec.custom_id,
                "endpoint": spec.endpoint.value,
                "prompt": spec.prompt,
                "messages": [{"role": m.role, "content": m.content} for m in spec.messages]
                if spec.messages
                else None,
                "params": _with_seed(spec.params).to_json(),
                "max_tokens": spec.params.max_tokens,
                "model": spec.model,
                "state": RequestState.QUEUED.value,
                "output_tokens": [],
                "output_text": "",
                "num_output_tokens": 0,
                "attempts": 0,
                "mlfq_level": 0,
                "enqueued_at": now,
                "lease_epoch": 0,
            }
            for idx, spec in enumerate(specs)
        )
        while chunk := list(islice(rows, INSERT_CHUNK)):
            conn.execute(requests.insert(), chunk)
            crash_point("mid_submit")
        return job_id

    # -- reading --------------------------------------------------------------

    def list_jobs(
        self,
        job_id: int | None = None,
        tenant: str | None = None,
        include_finished: bool = True,
        finished_limit: int | None = None,
    ) -> list[JobSummary]:
        """Jobs by id; finished ones only up to the newest `finished_limit`."""
        query = select(jobs)
        if job_id is not None:
            query = query.where(jobs.c.id == job_id)
        if tenant is not None:
            query = query.where(jobs.c.tenant == tenant)
        with self.db.read() as conn:
            active = conn.execute(
                query.where(jobs.c.state.not_in(FINISHED_JOB_STATES)).order_by(jobs.c.id)
            ).all()
            finished = []
            if include_finished or job_id is not None:
                finished_query = query.where(jobs.c.state.in_(FINISHED_JOB_STATES)).order_by(jobs.c.id.desc())
                if finished_limit is not None and job_id is None:
                    finished_query = finished_query.limit(finished_limit)
                finished = conn.execute(finished_query).all()
        if job_id is not None and not (active or finished):
            raise UnknownJob(job_id)
        rows = sorted([*active, *finished], key=lambda row: row.id)
        return [_job_summary(row) for row in rows]

    def list_tenants(self) -> list[TenantSummary]:
        waiting = (
            jobs.c.num_requests
            - jobs.c.num_done
            - jobs.c.num_failed
            - jobs.c.num_cancelled
            - jobs.c.num_running
        )
        load = (
            select(
                jobs.c.tenant,
                func.count().label("active_jobs"),
                func.sum(waiting).label("queued"),
                func.sum(jobs.c.num_running).label("running"),
            )
            .where(jobs.c.state.not_in(FINISHED_JOB_STATES))
            .group_by(jobs.c.tenant)
            .subquery()
        )
        query = (
            select(tenants.c.name, tenants.c.weight, load.c.active_jobs, load.c.queued, load.c.running)
            .select_from(tenants.outerjoin(load, load.c.tenant == tenants.c.name))
            .order_by(tenants.c.name)
        )
        with self.db.read() as conn:
            rows = conn.execute(query).all()
        return [
            TenantSummary(
                name=row.name,
                weight=row.weight,
                active_jobs=int(row.active_jobs or 0),
                queued=int(row.queued or 0),
                running=int(row.running or 0),
            )
            for row in rows
        ]

    def list_daemons(self) -> list[DaemonSummary]:
        with self.db.read() as conn:
            rows = conn.execute(
                select(daemons, (self.db.now() - daemons.c.heartbeat_at).label("age_s"))
                .order_by(daemons.c.heartbeat_at.desc())
            ).all()
        return [
            DaemonSummary(
                id=row.id,
                host=row.host,
                pid=row.pid,
                device=row.device,
                model=row.model,
                started_at=row.started_at,
                heartbeat_at=row.heartbeat_at,
                stopped_at=row.stopped_at,
                stats=row.stats or {},
                heartbeat_age_s=max(0.0, row.age_s),
            )
            for row in rows
        ]

    def iter_results(self, job_id: int, errors: bool = False) -> Iterator[RequestResult]:
        """Finished requests in input order: done ones, or with `errors` the rest."""
        wanted = (
            [RequestState.FAILED.value, RequestState.CANCELLED.value] if errors else [RequestState.DONE.value]
        )
        with self.db.read() as conn:
            if conn.execute(select(jobs.c.id).where(jobs.c.id == job_id)).first() is None:
                raise UnknownJob(job_id)
        last_idx = -1
        while True:
            # Keyset pages, each its own short read: a slow reader of a big
            # job never holds a transaction open for long.
            with self.db.read() as conn:
                page = conn.execute(
                    select(requests)
                    .where(
                        requests.c.job_id == job_id,
                        requests.c.idx > last_idx,
                        requests.c.state.in_(wanted),
                    )
                    .order_by(requests.c.idx)
                    .limit(RESULTS_BATCH)
                ).all()
            if not page:
                return
            for row in page:
                yield _request_result(row)
            last_idx = page[-1].idx

    def request_progress(self, job_id: int) -> list[RequestProgress]:
        """A job's requests in input order with their output so far: one short read."""
        with self.db.read() as conn:
            if conn.execute(select(jobs.c.id).where(jobs.c.id == job_id)).first() is None:
                raise UnknownJob(job_id)
            rows = conn.execute(
                select(
                    requests.c.id, requests.c.job_id, requests.c.state, requests.c.output_text,
                    requests.c.num_output_tokens, requests.c.enqueued_at, requests.c.first_token_at,
                    requests.c.finished_at, requests.c.finish_reason, requests.c.error,
                )
                .where(requests.c.job_id == job_id)
                .order_by(requests.c.idx)
            ).all()
        return [
            RequestProgress(
                id=row.id, job_id=row.job_id, state=RequestState(row.state), output_text=row.output_text,
                num_output_tokens=row.num_output_tokens, enqueued_at=row.enqueued_at,
                first_token_at=row.first_token_at, finished_at=row.finished_at,
                finish_reason=row.finish_reason, error=row.error,
            )
            for row in rows
        ]

    def request_timings(self, job_ids: Sequence[int]) -> list[RequestTiming]:
        """The given jobs' requests (by id) with tenant, class and timestamps: one read."""
        if not job_ids:
            return []
        with self.db.read() as conn:
            rows = conn.execute(
                select(
                    requests.c.id, requests.c.job_id, jobs.c.tenant, jobs.c["class"], requests.c.state,
                    requests.c.num_output_tokens, requests.c.enqueued_at, requests.c.first_token_at,
                    requests.c.finished_at,
                )
                .select_from(requests.join(jobs, jobs.c.id == requests.c.job_id))
                .where(requests.c.job_id.in_(list(job_ids)))
                .order_by(requests.c.id)
            ).all()
        return [
            RequestTiming(
                id=row.id, job_id=row.job_id, tenant=row.tenant, request_class=RequestClass(row[3]),
                state=RequestState(row.state), num_output_tokens=row.num_output_tokens,
                enqueued_at=row.enqueued_at, first_token_at=row.first_token_at, finished_at=row.finished_at,
            )
            for row in rows
        ]

    # -- cancelling -------------------------------------------------------------

    def cancel_job(self, job_id: int) -> CancelOutcome:
        now = self.clock()
        with self.db.write() as conn:
            job = self._lock_job(conn, job_id)
            state = JobState(job.state)
            if state.finished:
                return CancelOutcome(job_id, state, 0, 0, already_finished=True)
            cancelled_now = conn.execute(
                update(requests)
                .where(requests.c.job_id == job_id, requests.c.state.in_(WAITING_REQUEST_STATES))
                .values(state=RequestState.CANCELLED.value, finished_at=now)
            ).rowcount
            counts = replace(_counts(job), num_cancelled=job.num_cancelled + cancelled_now)
            state = self._store_counts(conn, job, counts, cancel_requested_at=now, now=now)
        return CancelOutcome(job_id, state, cancelled_now, counts.num_running, already_finished=False)

    # -- tenants ----------------------------------------------------------------

    def add_tenant(self, name: str, weight: float = 1.0) -> None:
        validate_tenant_name(name)
        weight = validate_weight(weight)
        with self.db.write() as conn:
            if conn.execute(select(tenants.c.name).where(tenants.c.name == name)).first():
                raise TenantExists(name)
            conn.execute(tenants.insert().values(name=name, weight=weight, created_at=self.clock()))

    def set_weight(self, name: str, weight: float) -> None:
        weight = validate_weight(weight)
        with self.db.write() as conn:
            changed = conn.execute(
                update(tenants).where(tenants.c.name == name).values(weight=weight)
            ).rowcount
            if not changed:
                raise UnknownTenant(name)

    def remove_tenant(self, name: str) -> None:
        with self.db.write() as conn:
            if not conn.execute(select(tenants.c.name).where(tenants.c.name == name)).first():
                raise UnknownTenant(name)
            unfinished = conn.execute(
                select(func.count()).where(jobs.c.tenant == name, jobs.c.state.not_in(FINISHED_JOB_STATES))
            ).scalar_one()
            if unfinished:
                raise TenantBusy(
                    f"tenant {name!r} has {unfinished} unfinished job(s); cancel them or "
                    "wait for them to finish first"
                )
            conn.execute(tenants.delete().where(tenants.c.name == name))

    # -- the daemon's side --------------------------------------------------------

    def claim(
        self,
        owner: str,
        per_group: int,
        held: Mapping[tuple[str, RequestClass], int] | None = None,
        limit: int | None = None,
        lease_s: float = 30.0,
    ) -> list[ClaimedRequest]:
        """Atomically move queued requests to `running`, leased to `owner` for `lease_s`.

        Each claim raises the request's lease epoch (the fencing token its
        writes must name) and sets the lease's expiry on the database's clock.

        Fair by construction: up to `per_group` for each (tenant, class)
        group, less what `held` says the owner already holds of it, taking a
        group's jobs by base priority then age and each job's requests in
        input order. So one tenant's 50,000-line file never hides another
        tenant's work from the scheduler.
        """
        held = held or {}
        now = self.clock()
        claimed: list = []
        waiting = (jobs.c.num_requests - jobs.c.num_done - jobs.c.num_failed - jobs.c.num_cancelled
                   - jobs.c.num_running)
        candidates_query = (
            select(jobs.c.id, jobs.c.tenant, jobs.c["class"].label("request_class"))
            .where(jobs.c.state.not_in(FINISHED_JOB_STATES), jobs.c.cancel_requested_at.is_(None),
                   waiting > 0)
            .order_by(jobs.c.priority, jobs.c.id)
        )
        # A read first: most calls find nothing to take, and take no write lock.
        with self.db.read() as conn:
            candidates = conn.execute(candidates_query).all()
        room = {(j.tenant, RequestClass(j.request_class)) for j in candidates}
        if all(per_group <= held.get(group, 0) for group in room):
            return []
        with self.db.write() as conn:
            candidates = conn.execute(candidates_query).all()
            room = {}
            for job in candidates:
                group = (job.tenant, RequestClass(job.request_class))
                room.setdefault(group, per_group - held.get(group, 0))
                want = room[group] if limit is None else min(room[group], limit - len(claimed))
                if want <= 0:
                    continue
                query = (
                    select(requests, jobs.c.tenant, jobs.c["class"].label("request_class"), jobs.c.priority)
                    .join(jobs, jobs.c.id == requests.c.job_id)
                    .where(requests.c.job_id == job.id, requests.c.state == RequestState.QUEUED.value)
                    .order_by(requests.c.idx)
                    .limit(want)
                )
                if self.db.dialect == "postgresql":
                    query = query.with_for_update(of=requests, skip_locked=True)
                rows = conn.execute(query).all()
                if not rows:
                    continue
                room[group] -= len(rows)
                claimed.extend(rows)
                conn.execute(
                    update(requests)
                    .where(requests.c.id.in_([row.id for row in rows]))
                    .values(
                        state=RequestState.RUNNING.value,
                        lease_owner=owner,
                        lease_epoch=requests.c.lease_epoch + 1,
                        lease_expires_at=self.db.now() + lease_s,
                        attempts=requests.c.attempts + 1,
                    )
                )
                locked = self._lock_job(conn, job.id)
                counts = replace(_counts(locked), num_running=locked.num_running + len(rows))
                self._store_counts(conn, locked, counts, started_at=locked.started_at or now, now=now)
        return [
            ClaimedRequest(
                id=row.id,
                job_id=row.job_id,
                tenant=row.tenant,
                request_class=RequestClass(row.request_class),
                priority=row.priority,
                custom_id=row.custom_id,
                endpoint=row.endpoint,
                prompt=row.prompt,
                messages=row.messages,
                params=row.params,
                output_tokens=list(row.output_tokens or []),
                enqueued_at=row.enqueued_at,
                attempts=row.attempts + 1,
                lease_epoch=row.lease_epoch + 1,
            )
            for row in claimed
        ]

    def flush_tokens(self, owner: str, updates: Sequence[TokenUpdate]) -> int:
        """Persist generated tokens so far, in one transaction; returns rows written.

        Only requests `owner` still holds, under the epoch each update names,
        are written: a daemon that lost a request (cancelled, reclaimed after
        its lease expired) writes nothing for it.
        """
        if not updates:
            return 0
        with self.db.write() as conn:
            rows = {
                row.id: row
                for row in conn.execute(
                    select(requests.c.id, requests.c.job_id, requests.c.num_output_tokens,
                           requests.c.lease_epoch).where(
                        requests.c.id.in_([u.request_id for u in updates]),
                        requests.c.lease_owner == owner,
                        requests.c.state == RequestState.RUNNING.value,
                    )
                )
            }
            per_job: dict[int, int] = {}
            writes = []
            for u in updates:
                row = rows.get(u.request_id)
                if row is None or (u.epoch is not None and row.lease_epoch != u.epoch):
                    continue  # fenced: the lease was lost (reclaimed, cancelled, requeued)
                writes.append({"b_id": u.request_id, "b_tokens": list(u.tokens), "b_text": u.text,
                               "b_num": len(u.tokens), "b_first": u.first_token_at})
                per_job[row.job_id] = per_job.get(row.job_id, 0) + len(u.tokens) - row.num_output_tokens
            if writes:
                conn.execute(FLUSH_TOKENS, writes)  # one executemany, not a statement per row
            written = len(writes)
            for job_id, delta in per_job.items():
                if delta:
                    conn.execute(update(jobs).where(jobs.c.id == job_id)
                                 .values(num_output_tokens=jobs.c.num_output_tokens + delta))
        return written

    def release(self, owner: str | None = None, request_ids: Sequence[int] | None = None) -> int:
        """Hand running requests back to the queue, keeping their flushed tokens.

        `owner` None releases every running request: on SQLite, one daemon
        at a time, so requests still `running` at its start were left by a
        dead one. Returns how many were released.
        """
        with self.db.write() as conn:
            query = select(requests.c.id, requests.c.job_id).where(
                requests.c.state == RequestState.RUNNING.value
            )
            if owner is not None:
                query = query.where(requests.c.lease_owner == owner)
            if request_ids is not None:
                query = query.where(requests.c.id.in_(list(request_ids)))
            rows = conn.execute(query).all()
            self._requeue(conn, rows)
        return len(rows)

    def renew_leases(self, owner: str, leases: Mapping[int, int], lease_s: float) -> set[int]:
        """Extend `owner`'s leases (request id -> epoch) by `lease_s` from now; return those still held.

        A request missing from the answer was lost: its lease expired and was
        reclaimed (or it was requeued or cancelled); the daemon drops it
        without writing anything more for it.
        """
        if not leases:
            return set()
        with self.db.write() as conn:
            rows = conn.execute(
                update(requests)
                .where(
                    requests.c.id.in_(list(leases)),
                    requests.c.lease_owner == owner,
                    requests.c.state == RequestState.RUNNING.value,
                )
                .values(lease_expires_at=self.db.now() + lease_s)
                .returning(requests.c.id, requests.c.lease_epoch)
            ).all()
        return {row.id for row in rows if leases.get(row.id) == row.lease_epoch}

    def reclaim_expired(self) -> int:
        """Requeue running requests whose lease expired (their daemon died or stalls).

        Any live daemon sweeps; the requests resume from their flushed tokens
        wherever they are claimed next, under a higher epoch, so the old
        holder's late writes are refused.
        """
        query = select(requests.c.id, requests.c.job_id).where(
            requests.c.state == RequestState.RUNNING.value,
            requests.c.lease_expires_at < self.db.now(),
        )
        with self.db.read() as conn:  # most sweeps find nothing: no write lock for them
            if conn.execute(query.limit(1)).first() is None:
                return 0
        if self.db.dialect == "postgresql":
            query = query.with_for_update(of=requests, skip_locked=True)
        with self.db.write() as conn:
            rows = conn.execute(query).all()
            self._requeue(conn, rows)
        return len(rows)

    def _requeue(self, conn: Connection, rows: Sequence) -> None:
        """Running requests (id, job_id) back to `queued`, keeping their tokens; counters follow.

        A request whose job was cancelled ends `cancelled` instead (tokens kept): no
        daemon claims work of a cancelled job, so requeued it would wait forever and
        its job would read `cancelling` for good. That happens when the cancel lands
        while the holder cannot act on it: a daemon killed, stopped or failing a step
        before its next sync. The job's row is locked before its cancel mark is read,
        so a concurrent `cancel` (which locks it too) is seen either way.
        """
        if not rows:
            return
        conn.execute(
            update(requests)
            .where(requests.c.id.in_([row.id for row in rows]))
            .values(state=RequestState.QUEUED.value, lease_owner=None, lease_expires_at=None)
        )
        per_job: dict[int, list[int]] = {}
        for row in rows:
            per_job.setdefault(row.job_id, []).append(row.id)
        now = self.clock()
        for job_id in sorted(per_job):  # a fixed order: two sweepers never deadlock on jobs
            job = self._lock_job(conn, job_id)
            ids = per_job[job_id]
            cancelled = 0
            if job.cancel_requested_at is not None:
                cancelled = conn.execute(
                    update(requests)
                    .where(requests.c.id.in_(ids))
                    .values(state=RequestState.CANCELLED.value, finished_at=now)
                ).rowcount
            counts = replace(_counts(job), num_running=job.num_running - len(ids),
                             num_cancelled=job.num_cancelled + cancelled)
            self._store_counts(conn, job, counts, now=now)

    def exchange_usage(self, owner: str, usage: Mapping[str, tuple[float, float]]) -> list[PeerUsage]:
        """Publish `owner`'s decayed usage per tenant (GPU s, KV token-s); return the other daemons'.

        Rows older than a day are dropped: with any sensible half-life they
        weigh nothing, and a cluster's dead daemons should not pile up.
        """
        now = self.db.now()
        with self.db.write() as conn:
            conn.execute(delete(daemon_usage).where(
                (daemon_usage.c.daemon == owner) | (daemon_usage.c.updated_at < now - USAGE_KEPT_S)
            ))
            if usage:
                stamp = conn.execute(select(now)).scalar_one()
                conn.execute(daemon_usage.insert(), [
                    {"daemon": owner, "tenant": tenant, "gpu_s": gpu, "kv_token_s": kv, "updated_at": stamp}
                    for tenant, (gpu, kv) in usage.items()
                ])
            rows = conn.execute(
                select(daemon_usage, (now - daemon_usage.c.updated_at).label("age_s"))
                .where(daemon_usage.c.daemon != owner)
            ).all()
        return [PeerUsage(row.daemon, row.tenant, row.gpu_s, row.kv_token_s, max(0.0, row.age_s))
                for row in rows]

    def cancelled_held(self, owner: str) -> list[int]:
        """Requests `owner` holds whose job a user cancelled: stop them at the next step."""
        with self.db.read() as conn:
            return list(
                conn.execute(
                    select(requests.c.id)
                    .join(jobs, jobs.c.id == requests.c.job_id)
                    .where(
                        requests.c.lease_owner == owner,
                        requests.c.state == RequestState.RUNNING.value,
                        jobs.c.cancel_requested_at.is_not(None),
                    )
                ).scalars()
            )

    def tenant_weights(self) -> dict[str, float]:
        with self.db.read() as conn:
            return {row.name: row.weight for row in conn.execute(select(tenants.c.name, tenants.c.weight))}

    def has_queued(self, running_too: bool = False) -> bool:
        """Whether any request waits (or, with `running_too`, is still held by some daemon)."""
        states = [RequestState.QUEUED.value] + ([RequestState.RUNNING.value] if running_too else [])
        with self.db.read() as conn:
            return conn.execute(
                select(requests.c.id).where(requests.c.state.in_(states)).limit(1)
            ).first() is not None

    def heartbeat(self, daemon: DaemonSummary) -> None:
        """Insert or refresh a daemon's row: its host, engine and figures."""
        now = self.db.now()  # the database's clock: daemons' clocks may disagree
        values = {
            "host": daemon.host, "pid": daemon.pid, "device": daemon.device, "model": daemon.model,
            "started_at": daemon.started_at, "heartbeat_at": now,
            "stopped_at": now if daemon.stopped_at is not None else None, "stats": daemon.stats,
        }
        with self.db.write() as conn:
            changed = conn.execute(update(daemons).where(daemons.c.id == daemon.id).values(**values)).rowcount
            if not changed:
                conn.execute(daemons.insert().values(id=daemon.id, **values))

    def finish_request(
        self,
        request_id: int,
        state: RequestState,
        output_tokens: Sequence[int] = (),
        output_text: str = "",
        finish_reason: str | None = None,
        prompt_tokens: int | None = None,
        model: str | None = None,
        error: str | None = None,
        owner: str | None = None,
        first_token_at: float | None = None,
        epoch: int | None = None,
    ) -> bool:
        """End one request; see `finish_requests`."""
        completion = Completion(request_id, state, tuple(output_tokens), output_text, finish_reason,
                                prompt_tokens, model, error, first_token_at, epoch)
        return self.finish_requests([completion], owner)[0]

    def finish_requests(self, completions: Sequence[Completion], owner: str | None = None) -> list[bool]:
        """End requests with their final output, in one transaction with their jobs' counters.

        For each: False, changing nothing, when the request had already ended
        (no request ends twice) or, given an `owner`, when that owner no
        longer holds it under the completion's epoch (a fenced daemon writes
        nothing).
        """
        for c in completions:
            if not c.state.finished:
                raise ValueError(f"{c.state} is not a final state")
        if not completions:
            return []
        now = self.clock()
        outcome = []
        with self.db.write() as conn:
            rows = {
                row.id: row
                for row in conn.execute(
                    select(requests.c.id, requests.c.job_id, requests.c.state, requests.c.num_output_tokens,
                           requests.c.lease_owner, requests.c.lease_epoch)
                    .where(requests.c.id.in_([c.request_id for c in completions]))
                )
            }
            per_job: dict[int, list[int]] = {}  # job -> [running, done, failed, cancelled, tokens]
            writes = []
            for c in completions:
                row = rows.get(c.request_id)
                if row is None:
                    raise StoreError(f"no request with id {c.request_id}")
                previous = RequestState(row.state)
                fenced = owner is not None and (
                    row.lease_owner != owner or (c.epoch is not None and row.lease_epoch != c.epoch)
                )
                if previous.finished or fenced:
                    outcome.append(False)
                    continue
                writes.append({
                    "b_id": c.request_id, "b_state": c.state.value, "b_tokens": list(c.output_tokens),
                    "b_text": c.output_text, "b_num": len(c.output_tokens), "b_reason": c.finish_reason,
                    "b_prompt": c.prompt_tokens, "b_model": c.model, "b_error": c.error, "b_now": now,
                    "b_first": c.first_token_at,
                })
                delta = per_job.setdefault(row.job_id, [0, 0, 0, 0, 0])
                delta[0] += previous is RequestState.RUNNING
                delta[1] += c.state is RequestState.DONE
                delta[2] += c.state is RequestState.FAILED
                delta[3] += c.state is RequestState.CANCELLED
                delta[4] += len(c.output_tokens) - row.num_output_tokens
                outcome.append(True)
            if writes:
                conn.execute(FINISH_REQUEST, writes)  # one executemany, not a statement per row
            for job_id, (running, done, failed, cancelled, tokens) in per_job.items():
                job = self._lock_job(conn, job_id)
                counts = replace(
                    _counts(job),
                    num_running=job.num_running - running,
                    num_done=job.num_done + done,
                    num_failed=job.num_failed + failed,
                    num_cancelled=job.num_cancelled + cancelled,
                )
                self._store_counts(conn, job, counts, num_output_tokens=job.num_output_tokens + tokens,
                                   now=now)
            if per_job:
                crash_point("before_done_commit")
        return outcome

    # -- helpers ------------------------------------------------------------------

    def _lock_job(self, conn: Connection, job_id: int):
        query = select(jobs).where(jobs.c.id == job_id)
        if self.db.dialect == "postgresql":
            query = query.with_for_update()
        job = conn.execute(query).first()
        if job is None:
            raise UnknownJob(job_id)
        return job

    def _store_counts(self, conn: Connection, job, counts: JobCounts, now: float, **extra) -> JobState:
        cancel_requested = (extra.get("cancel_requested_at") or job.cancel_requested_at) is not None
        started = (extra.get("started_at") or job.started_at) is not None
        state = derive_job_state(counts, started=started, cancel_requested=cancel_requested)
        values = {
            "num_done": counts.num_done,
            "num_failed": counts.num_failed,
            "num_cancelled": counts.num_cancelled,
            "num_running": counts.num_running,
            "state": state.value,
            **extra,
        }
        if state.finished and job.finished_at is None:
            values["finished_at"] = now
        conn.execute(update(jobs).where(jobs.c.id == job.id).values(**values))
        return state


def _with_seed(params):
    """Every stored request has a seed, so its sampling replays after a restart."""
    return params if params.seed is not None else replace(params, seed=secrets.randbits(63))


def _counts(job) -> JobCounts:
    return JobCounts(
        num_requests=job.num_requests,
        num_done=job.num_done,
        num_failed=job.num_failed,
        num_cancelled=job.num_cancelled,
        num_running=job.num_running,
    )


def _job_summary(row) -> JobSummary:
    return JobSummary(
        id=row.id,
        tenant=row.tenant,
        request_class=RequestClass(row._mapping["class"]),
        priority=row.priority,
        name=row.name,
        state=JobState(row.state),
        counts=_counts(row),
        num_output_tokens=row.num_output_tokens,
        submitted_at=row.submitted_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )


def _request_result(row) -> RequestResult:
    return RequestResult(
        id=row.id,
        idx=row.idx,
        custom_id=row.custom_id,
        endpoint=row.endpoint,
        state=RequestState(row.state),
        model=row.model,
        output_text=row.output_text,
        num_output_tokens=row.num_output_tokens,
        prompt_tokens=row.prompt_tokens,
        finish_reason=row.finish_reason,
        error=row.error,
        finished_at=row.finished_at,
    )
