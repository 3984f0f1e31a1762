"""MemoryCatalogStore: the CatalogStore contract in memory, over rows the queue shares.

What `fsched` commands and the HTTP server do to the job table (submit,
list, results, cancel, tenants, daemons), with the SQL catalog's semantics:
a submit lands whole or not at all, a tenant's queue limit is counted in the
same call, counters move with the rows, results come in input order.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import replace

from fsched.core.jobs.jobstate import JobSummary
from fsched.core.jobs.limits import DEFAULT_MAX_QUEUED_PER_TENANT
from fsched.core.jobs.tenants import validate_tenant_name, validate_weight
from fsched.core.ports.catalog import admit_each
from fsched.core.ports.lines import finished_lines
from fsched.core.ports.memory.reads import ONLINE_WINDOW_S, online_groups, result_of
from fsched.core.ports.memory.rows import MemoryJob, MemoryRequest, MemoryRows, atomic
from fsched.core.ports.records import (
    CancelOutcome,
    DaemonSummary,
    JobSubmission,
    KeyRevoked,
    OnlineGroup,
    QueueFull,
    RequestProgress,
    RequestResult,
    RequestTiming,
    StoreError,
    SubmittedJob,
    TenantBusy,
    TenantExists,
    TenantSummary,
    UnknownJob,
    UnknownTenant,
)
from fsched.core.types import RequestStatus

# Seeds by place: a request stored without one draws the same tokens in every run of a test.
SEED_STRIDE = 1_000_003


class MemoryCatalogStore:
    def __init__(self, rows: MemoryRows):
        self.rows = rows

    # -- submit -------------------------------------------------------------------------------

    @atomic
    def submit(self, submissions: Sequence[JobSubmission],
               max_queued_per_tenant: int = DEFAULT_MAX_QUEUED_PER_TENANT) -> list[SubmittedJob]:
        """Every job or none: the names, the custom ids and the queue limit are checked first."""
        for s in submissions:
            validate_tenant_name(s.tenant)
            _check_unique(s)
        adding = Counter()
        for s in submissions:
            adding[s.tenant] += len(s.requests)
        for tenant in sorted(adding):
            have = self.rows.unfinished_of(tenant)
            if have + adding[tenant] > max_queued_per_tenant:
                raise QueueFull(tenant, have, adding[tenant], max_queued_per_tenant)
        created = self._create_missing({s.tenant for s in submissions})
        return [self._insert(s, s.tenant in created) for s in submissions]

    def prepare_submits(self) -> None:
        """Nothing to make ready in memory."""

    @atomic
    def submit_each(self, submissions: Sequence[JobSubmission], max_queued_per_tenant: int =
                    DEFAULT_MAX_QUEUED_PER_TENANT) -> list[SubmittedJob | QueueFull | KeyRevoked]:
        """Each job on its own terms: one over its tenant's limit (counted after those before it) gets
        its QueueFull, one whose API key is revoked or unknown its KeyRevoked, the others are stored."""
        for s in submissions:
            validate_tenant_name(s.tenant)
            _check_unique(s)
        created = self._create_missing({s.tenant for s in submissions})
        have = Counter({name: self.rows.unfinished_of(name) for name in {s.tenant for s in submissions}})
        usable = {key_id for key_id, key in self.rows.api_keys.items() if not key.revoked}
        return [o if isinstance(o, (QueueFull, KeyRevoked)) else self._insert(o, o.tenant in created)
                for o in admit_each(submissions, usable, have, max_queued_per_tenant)]

    def _create_missing(self, names: set[str]) -> set[str]:
        missing = names - set(self.rows.tenants)
        for name in missing:
            self.rows.tenants[name] = 1.0
        return missing

    def _insert(self, s: JobSubmission, tenant_created: bool) -> SubmittedJob:
        now = self.rows.clock()
        job_id = self.rows.next_job_id()
        ids = []
        for idx, spec in enumerate(s.requests):
            params = spec.params if spec.params.seed is not None else replace(
                spec.params, seed=job_id * SEED_STRIDE + idx)
            request = MemoryRequest(
                id=self.rows.next_request_id(), job_id=job_id, idx=idx, custom_id=spec.custom_id,
                endpoint=spec.endpoint.value, prompt=spec.prompt,
                messages=[m.to_json() for m in spec.messages] if spec.messages else None,
                params=params.to_json(), enqueued_at=now, choice=spec.choice,
                answer=spec.answer.to_json() or None, model=spec.model, render=spec.render.to_json(),
            )
            self.rows.requests[request.id] = request
            ids.append(request.id)
        self.rows.jobs[job_id] = MemoryJob(job_id, s.tenant, s.request_class, s.priority, s.name, s.origin,
                                           s.key_id, ids, now)
        return SubmittedJob(job_id, len(ids), s.tenant, s.request_class, tenant_created)

    # -- reading --------------------------------------------------------------------------------

    @atomic
    def list_jobs(self, job_id: int | None = None, tenant: str | None = None, include_finished: bool = True,
                  finished_limit: int | None = None, interactive: bool | None = None) -> list[JobSummary]:
        chosen = [j for j in self.rows.jobs.values()
                  if (job_id is None or j.id == job_id) and (tenant is None or j.tenant == tenant)
                  and (interactive is None or j.origin.interactive == interactive)]
        if job_id is not None:
            if not chosen:
                raise UnknownJob(job_id)
            return [chosen[0].summary()]
        active = [j for j in chosen if not j.state.finished]
        finished = sorted((j for j in chosen if j.state.finished), key=lambda j: -j.id)
        finished = finished[:finished_limit] if include_finished else []
        return [j.summary() for j in sorted([*active, *finished], key=lambda j: j.id)]

    @atomic
    def online_groups(self, tenant: str | None = None,
                      window_s: float = ONLINE_WINDOW_S) -> list[OnlineGroup]:
        return online_groups(self.rows, self.rows.clock() - window_s, tenant)

    @atomic
    def iter_results(self, job_id: int, errors: bool = False) -> Iterator[RequestResult]:
        """Read whole at once (the rows cannot change under a reader in memory)."""
        job = self.rows.job(job_id)
        rows = [r for r in self._in_order(job)
                if (r.status.is_finished and r.status.succeeded != errors)
                or (r.answer is not None and r.status.is_finished)]
        return iter(list(finished_lines(map(result_of, rows), errors)))

    @atomic
    def request_progress(self, job_id: int) -> list[RequestProgress]:
        return [
            RequestProgress(
                id=r.id, job_id=r.job_id, status=r.status, output_text=r.output_text,
                num_output_tokens=len(r.output_tokens), enqueued_at=r.enqueued_at,
                first_token_at=r.first_token_at, finished_at=r.finished_at,
                error=r.error,
            )
            for r in self._in_order(self.rows.job(job_id))
        ]

    @atomic
    def request_timings(self, job_ids: Sequence[int]) -> list[RequestTiming]:
        wanted = set(job_ids)
        chosen = sorted((r for r in self.rows.requests.values() if r.job_id in wanted),
                        key=lambda r: int(r.id))
        return [
            RequestTiming(
                id=r.id, job_id=r.job_id, tenant=self.rows.jobs[r.job_id].tenant,
                request_class=self.rows.jobs[r.job_id].request_class, status=r.status,
                num_output_tokens=len(r.output_tokens), enqueued_at=r.enqueued_at,
                first_token_at=r.first_token_at, finished_at=r.finished_at,
            )
            for r in chosen
        ]

    def _in_order(self, job: MemoryJob) -> list[MemoryRequest]:
        return sorted(map(self.rows.requests.get, job.request_ids), key=lambda r: r.idx)

    # -- cancelling -------------------------------------------------------------------------------

    @atomic
    def cancel_job(self, job_id: int) -> CancelOutcome:
        job = self.rows.job(job_id)
        if job.state.finished:
            return CancelOutcome(job_id, job.state, 0, 0, already_finished=True)
        now = self.rows.clock()
        waiting = [r for r in map(self.rows.requests.get, job.request_ids) if r.status.is_waiting]
        for request in waiting:
            job.ended(request.status, RequestStatus.FINISHED_CANCELLED)
            request.status, request.finished_at = RequestStatus.FINISHED_CANCELLED, now
        job.cancel_requested_at = now
        return CancelOutcome(job_id, job.settle(now), len(waiting), job.num_running, already_finished=False)

    # -- tenants and daemons ------------------------------------------------------------------------

    @atomic
    def list_tenants(self) -> list[TenantSummary]:
        load: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # active jobs, waiting, running
        for job in self.rows.jobs.values():
            if not job.state.finished:
                figures = load[job.tenant]
                figures[0] += 1
                figures[1] += job.counts.num_waiting
                figures[2] += job.num_running
        return [TenantSummary(name, weight, *load.get(name, (0, 0, 0)))
                for name, weight in sorted(self.rows.tenants.items())]

    @atomic
    def add_tenant(self, name: str, weight: float = 1.0) -> None:
        validate_tenant_name(name)
        weight = validate_weight(weight)
        if name in self.rows.tenants:
            raise TenantExists(name)
        self.rows.tenants[name] = weight

    @atomic
    def set_weight(self, name: str, weight: float) -> None:
        weight = validate_weight(weight)
        if name not in self.rows.tenants:
            raise UnknownTenant(name)
        self.rows.tenants[name] = weight

    @atomic
    def remove_tenant(self, name: str) -> None:
        if name not in self.rows.tenants:
            raise UnknownTenant(name)
        unfinished = sum(1 for j in self.rows.jobs.values() if j.tenant == name and not j.state.finished)
        if unfinished:
            raise TenantBusy(f"tenant {name!r} has {unfinished} unfinished job(s); cancel them or "
                             "wait for them to finish first")
        del self.rows.tenants[name]

    @atomic
    def list_daemons(self) -> list[DaemonSummary]:
        now = self.rows.clock()
        newest_first = sorted(self.rows.daemons.values(), key=lambda d: -d.heartbeat_at)
        return [replace(d, heartbeat_age_s=max(0.0, now - d.heartbeat_at)) for d in newest_first]

    def file_owner(self) -> int | None:
        return self.rows.file_owner


def _check_unique(submission: JobSubmission) -> None:
    """A job's requests are unique by (custom_id, choice), as the SQL table's constraint has them."""
    seen = set()
    for spec in submission.requests:
        key = (spec.custom_id, spec.choice)
        if key in seen:
            raise StoreError(f"duplicate custom_id {spec.custom_id!r} (choice {spec.choice}) in one job")
        seen.add(key)
