"""SqlCatalogStore: the commands' side of the job table (CatalogStore) over SQLAlchemy Core.

Every method is one transaction; reads of big jobs page by key, so a slow
reader never holds a transaction open for long.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace

from sqlalchemy import func, select, update

from fsched.core.jobs.jobstate import JobSummary
from fsched.core.jobs.limits import DEFAULT_MAX_QUEUED_PER_TENANT
from fsched.core.jobs.tenants import validate_tenant_name, validate_weight
from fsched.core.ports.lines import finished_lines
from fsched.core.ports.records import (
    CancelOutcome,
    DaemonStats,
    DaemonSummary,
    JobSubmission,
    KeyRevoked,
    OnlineGroup,
    QueueFull,
    RequestProgress,
    RequestResult,
    RequestTiming,
    SubmittedJob,
    TenantBusy,
    TenantExists,
    TenantSummary,
    UnknownJob,
    UnknownTenant,
)
from fsched.core.types import JobOrigin, JobState, RequestClass
from fsched.storage.activity import ONLINE_WINDOW_S, online_groups
from fsched.storage.base import SqlStoreBase
from fsched.storage.counters import lock_job, store_counts
from fsched.storage.db import database_clock
from fsched.storage.direct import DirectConnection
from fsched.storage.kept import KeptWriter
from fsched.storage.logprobs import read as read_logprobs
from fsched.storage.output import read as read_outputs
from fsched.storage.prepared import Prepared
from fsched.storage.rows import (
    FINISHED_JOB_STATES,
    PROGRESS_COLUMNS,
    UNFINISHED_JOB_STATES,
    WAITING,
    WAITING_REQUEST_STATES,
    RowState,
    core_id,
    daemons,
    job_counts,
    job_summary,
    jobs,
    request_progress,
    request_result,
    requests,
    status_of_row,
    tenants,
)
from fsched.storage.submit import (
    GROUP_COMMIT_STATEMENTS,
    PREPARED_TENANTS,
    SQLITE_GROUP_COMMIT_STATEMENTS,
    check_queue_limit,
    create_missing_tenants,
    group_commit,
    insert_job,
    sqlite_group_commit,
)

RESULTS_BATCH = 1_000
DAEMONS_NEWEST_FIRST = Prepared(select(daemons, (database_clock() - daemons.c.heartbeat_at).label("age_s"))
                                .order_by(daemons.c.heartbeat_at.desc()))


class SqlCatalogStore(SqlStoreBase):
    """Submit, list, results, cancel, tenants and daemons: what the commands do."""

    _group_writer: KeptWriter | None = None
    _group_direct: DirectConnection | None = None
    _group_refused = False  # the last group commit refused a job (storage/submit.py's `group_commit`)

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
        with self.db.write() as conn:
            created = create_missing_tenants(conn, self.db.dialect, {s.tenant for s in submissions}, now)
            check_queue_limit(conn, submissions, max_queued_per_tenant)
            return [
                SubmittedJob(
                    job_id=insert_job(conn, s, now),
                    num_requests=len(s.requests),
                    tenant=s.tenant,
                    request_class=s.request_class,
                    tenant_created=s.tenant in created,
                )
                for s in submissions
            ]

    def submit_each(
        self,
        submissions: Sequence[JobSubmission],
        max_queued_per_tenant: int = DEFAULT_MAX_QUEUED_PER_TENANT,
    ) -> list[SubmittedJob | QueueFull | KeyRevoked]:
        """Store each job on its own terms in one transaction for all (a group commit of the
        HTTP server's online requests): a job over its tenant's limit gets its QueueFull in its
        place, counted after the jobs before it in the list, and one whose API key is revoked or
        unknown its KeyRevoked."""
        now = self.clock()
        names = {s.tenant for s in submissions}
        for name in names:
            validate_tenant_name(name)
        if not submissions:
            return []
        if self.db.dialect == "postgresql":
            outcomes, stored_ids, created = group_commit(self._group_writer_made(), submissions,
                                                         max_queued_per_tenant, now, not self._group_refused)
            self._group_refused = len(stored_ids) < len(submissions)
        else:
            outcomes, stored_ids, created = sqlite_group_commit(self._group_direct_made(), submissions,
                                                                max_queued_per_tenant, now)
        job_ids = iter(stored_ids)
        return [s if isinstance(s, (QueueFull, KeyRevoked)) else SubmittedJob(
            job_id=next(job_ids), num_requests=len(s.requests), tenant=s.tenant,
            request_class=s.request_class, tenant_created=s.tenant in created) for s in outcomes]

    def prepare_submits(self) -> None:
        """The group commit's statements compiled and its connection opened now, on the calling thread (a
        fresh server's first online request spent 15-18 ms in fsched on SQLite without it, 11 with it,
        the next ones 4; on PostgreSQL 38-39, 23-24 and 7: docs/http.md)."""
        if self.db.dialect == "postgresql":
            self._group_writer_made().prepare()
        else:
            dialect = self.db.engine.dialect
            for statement in SQLITE_GROUP_COMMIT_STATEMENTS:
                statement.compile_ahead(dialect, PREPARED_TENANTS)
            self._group_direct_made().connect()

    def _group_writer_made(self) -> KeptWriter:
        if self._group_writer is None:
            self._group_writer = KeptWriter(self.db, statements=GROUP_COMMIT_STATEMENTS)
        return self._group_writer

    def _group_direct_made(self) -> DirectConnection:
        if self._group_direct is None:
            self._group_direct = DirectConnection(self.db)
        return self._group_direct

    # -- reading --------------------------------------------------------------

    def list_jobs(
        self,
        job_id: int | None = None,
        tenant: str | None = None,
        include_finished: bool = True,
        finished_limit: int | None = None,
        interactive: bool | None = None,
    ) -> list[JobSummary]:
        """Jobs by id; finished ones only up to the newest `finished_limit`; with `interactive`, only
        the one-request jobs of online requests and `generate` (True) or only the others (False)."""
        query = select(jobs)
        if job_id is not None:
            query = query.where(jobs.c.id == job_id)
        if tenant is not None:
            query = query.where(jobs.c.tenant == tenant)
        if interactive is not None:
            doors = [o.value for o in JobOrigin if o.interactive]
            query = query.where(jobs.c.origin.in_(doors) if interactive else jobs.c.origin.not_in(doors))
        with self.db.read() as conn:
            active = conn.execute(
                query.where(jobs.c.state.in_(UNFINISHED_JOB_STATES)).order_by(jobs.c.id)
            ).all()
            finished = []
            if include_finished or job_id is not None:
                finished_query = query.where(jobs.c.state.in_(FINISHED_JOB_STATES)).order_by(jobs.c.id.desc())
                if finished_limit is not None and job_id is None:
                    finished_query = finished_query.limit(finished_limit)
                finished = conn.execute(finished_query).all()
        if job_id is not None and not (active or finished):
            raise UnknownJob(job_id)
        # Two reads: on PostgreSQL (read committed) a job that ends between them is in both; the later
        # read, the finished row, is the one kept.
        rows = {row.id: row for row in [*active, *finished]}
        return [job_summary(rows[job]) for job in sorted(rows)]

    def online_groups(self, tenant: str | None = None,
                      window_s: float = ONLINE_WINDOW_S) -> list[OnlineGroup]:
        """Online requests and `generate` prompts grouped per tenant and API key (see `activity`)."""
        return online_groups(self.db, self.clock() - window_s, tenant)

    def list_tenants(self) -> list[TenantSummary]:
        load = (
            select(
                jobs.c.tenant,
                func.count().label("active_jobs"),
                func.sum(WAITING).label("queued"),
                func.sum(jobs.c.num_running).label("running"),
            )
            .where(jobs.c.state.in_(UNFINISHED_JOB_STATES))
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
            TenantSummary(name=row.name, weight=row.weight, active_jobs=int(row.active_jobs or 0),
                          queued=int(row.queued or 0), running=int(row.running or 0))
            for row in rows
        ]

    def list_daemons(self) -> list[DaemonSummary]:
        rows = self.db.rows(DAEMONS_NEWEST_FIRST)  # the HTTP server's check, several times a second
        return [
            DaemonSummary(
                id=row.id, host=row.host, pid=row.pid, device=row.device, model=row.model,
                started_at=row.started_at, heartbeat_at=row.heartbeat_at, stopped_at=row.stopped_at,
                stats=DaemonStats.from_json(row.stats or {}), heartbeat_age_s=max(0.0, row.age_s),
            )
            for row in rows
        ]

    def iter_results(self, job_id: int, errors: bool = False) -> Iterator[RequestResult]:
        """Finished lines' requests in input order: the lines all of whose choices are done, or with
        `errors` the lines that ended otherwise (a failed choice fails its line)."""
        self._check_job(job_id)
        yield from finished_lines(self._finished_rows(job_id, errors), errors)

    def _finished_rows(self, job_id: int, errors: bool) -> Iterator[RequestResult]:
        """Rows in the state asked for, and every finished row of a line of several choices."""
        wanted = [RowState.FAILED.value, RowState.CANCELLED.value] if errors \
            else [RowState.DONE.value]
        finished = [RowState.DONE.value, RowState.FAILED.value, RowState.CANCELLED.value]
        several = requests.c.answer.is_not(None) & requests.c.state.in_(finished)
        chosen = requests.c.state.in_(wanted) | several
        last_idx = -1
        while True:
            # Keyset pages, each its own short read: a slow reader of a big
            # job never holds a transaction open for long.
            with self.db.read() as conn:
                page = conn.execute(
                    select(requests)
                    .where(requests.c.job_id == job_id, requests.c.idx > last_idx, chosen)
                    .order_by(requests.c.idx)
                    .limit(RESULTS_BATCH)
                ).all()
                stored = read_logprobs(conn, [row.id for row in page if row.num_logprobs])
                outputs = read_outputs(conn, page)
            if not page:
                return
            for row in page:
                yield request_result(row, stored.get(row.id, ()), outputs.get(row.id))
            last_idx = page[-1].idx

    def request_progress(self, job_id: int) -> list[RequestProgress]:
        """A job's requests in input order with their output so far: one short read."""
        self._check_job(job_id)
        with self.db.read() as conn:
            rows = conn.execute(
                select(*PROGRESS_COLUMNS).where(requests.c.job_id == job_id).order_by(requests.c.idx)
            ).all()
            stored = read_logprobs(conn, [row.id for row in rows if row.num_logprobs])
            outputs = read_outputs(conn, rows)
        return [request_progress(row, stored.get(row.id, ()), outputs.get(row.id)) for row in rows]

    def request_timings(self, job_ids: Sequence[int]) -> list[RequestTiming]:
        """The given jobs' requests (by id) with tenant, class and timestamps: one read."""
        if not job_ids:
            return []
        with self.db.read() as conn:
            rows = conn.execute(
                select(
                    requests.c.id, requests.c.job_id, jobs.c.tenant, jobs.c["class"], requests.c.state,
                    requests.c.num_output_tokens, requests.c.enqueued_at, requests.c.first_token_at,
                    requests.c.finished_at, requests.c.finish_reason,
                )
                .select_from(requests.join(jobs, jobs.c.id == requests.c.job_id))
                .where(requests.c.job_id.in_(list(job_ids)))
                .order_by(requests.c.id)
            ).all()
        return [
            RequestTiming(
                id=core_id(row.id), job_id=row.job_id, tenant=row.tenant, request_class=RequestClass(row[3]),
                status=status_of_row(row.state, row.finish_reason), num_output_tokens=row.num_output_tokens,
                enqueued_at=row.enqueued_at, first_token_at=row.first_token_at, finished_at=row.finished_at,
            )
            for row in rows
        ]

    def _check_job(self, job_id: int) -> None:
        with self.db.read() as conn:
            if conn.execute(select(jobs.c.id).where(jobs.c.id == job_id)).first() is None:
                raise UnknownJob(job_id)

    # -- cancelling -------------------------------------------------------------

    def cancel_job(self, job_id: int) -> CancelOutcome:
        now = self.clock()
        with self.db.write() as conn:
            job = lock_job(conn, self.db.dialect, job_id)
            state = JobState(job.state)
            if state.finished:
                return CancelOutcome(job_id, state, 0, 0, already_finished=True)
            cancelled_now = conn.execute(
                update(requests)
                .where(requests.c.job_id == job_id, requests.c.state.in_(WAITING_REQUEST_STATES))
                .values(state=RowState.CANCELLED.value, finished_at=now)
            ).rowcount
            counts = replace(job_counts(job), num_cancelled=job.num_cancelled + cancelled_now)
            state = store_counts(conn, job, counts, now, cancel_requested_at=now)
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
                select(func.count()).where(jobs.c.tenant == name, jobs.c.state.in_(UNFINISHED_JOB_STATES))
            ).scalar_one()
            if unfinished:
                raise TenantBusy(
                    f"tenant {name!r} has {unfinished} unfinished job(s); cancel them or "
                    "wait for them to finish first"
                )
            conn.execute(tenants.delete().where(tenants.c.name == name))

