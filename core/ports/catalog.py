"""CatalogStore: what the commands need from the job table.

Users submit jobs, follow them, read their results, cancel them, manage
tenants and look at the daemons. None of this touches a lease: the daemons'
side is `queue.QueueStore`.

What every implementation must hold:

1. **All or nothing.** A submit stores every job and all its requests, or
   nothing; a tenant named for the first time is created with weight 1.
2. **A bounded queue.** A submit that would take a tenant's unfinished
   requests over the limit raises QueueFull and stores nothing, even when
   two submits of one tenant race.
3. **Counters agree with rows.** A job's counts (done, failed, cancelled,
   running) and its state always match its requests, so listing jobs never
   counts request rows.
4. **Results in input order.** A job's results come back in the order of its
   input file, whatever order its requests finished in.
5. **Cancel at once, or at the next step.** Cancelling ends a job's waiting
   requests at once; its running ones are ended by their daemon.
6. **Ids are the job table's.** Job and request ids here are the integers
   commands print and users type.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

from fsched.core.jobs.jobstate import JobSummary
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
    SubmittedJob,
    TenantSummary,
)


@runtime_checkable
class CatalogStore(Protocol):
    def submit(
        self, submissions: Sequence[JobSubmission], max_queued_per_tenant: int = ...
    ) -> list[SubmittedJob]:
        """Store jobs and their requests in one transaction; QueueFull over a tenant's limit."""
        ...

    def submit_each(
        self, submissions: Sequence[JobSubmission], max_queued_per_tenant: int = ...
    ) -> list[SubmittedJob | QueueFull | KeyRevoked]:
        """Store each job on its own terms, in one transaction for all (a group commit): a job over
        its tenant's limit gets its QueueFull in its place, one whose API key (`key_id`) is revoked
        or not in the table its KeyRevoked, the others are stored."""
        ...

    def prepare_submits(self) -> None:
        """Make ready now, on the calling thread (the one that will call `submit_each`), what a group
        commit uses: its connection and its statements; a fresh server's first online request then
        does not wait for them."""
        ...

    def list_jobs(
        self,
        job_id: int | None = None,
        tenant: str | None = None,
        include_finished: bool = True,
        finished_limit: int | None = None,
        interactive: bool | None = None,
    ) -> list[JobSummary]:
        """Jobs by id, unfinished ones and (up to the newest `finished_limit`) finished ones; with
        `interactive` True only online requests' and `generate`'s one-request jobs, False only the
        others (submitted files, batches).

        UnknownJob when a `job_id` is asked for and does not exist.
        """
        ...

    def online_groups(self, tenant: str | None = None, window_s: float = ...) -> list[OnlineGroup]:
        """Online requests (and `generate` prompts) grouped per tenant and API key: counts, in flight,
        first-token latency of those whose first token came in the last `window_s` seconds."""
        ...

    def cancel_job(self, job_id: int) -> CancelOutcome:
        """Cancel a job's waiting requests now and mark it so its daemons stop the running ones."""
        ...

    def iter_results(self, job_id: int, errors: bool = False) -> Iterator[RequestResult]:
        """A job's finished requests in input order: done ones, or with `errors` the others."""
        ...

    def request_progress(self, job_id: int) -> list[RequestProgress]:
        """A job's requests in input order with their output so far."""
        ...

    def request_timings(self, job_ids: Sequence[int]) -> list[RequestTiming]:
        """The given jobs' requests with tenant, class and timestamps, by request id."""
        ...

    def list_tenants(self) -> list[TenantSummary]:
        """Every tenant with its weight and its unfinished work, by name."""
        ...

    def add_tenant(self, name: str, weight: float = 1.0) -> None:
        """Create a tenant; TenantExists if it does, ValueError for a bad name or weight."""
        ...

    def set_weight(self, name: str, weight: float) -> None:
        """Change a tenant's weight; daemons apply it at their next sync. UnknownTenant if none."""
        ...

    def remove_tenant(self, name: str) -> None:
        """Remove a tenant without unfinished jobs (TenantBusy otherwise); its history stays."""
        ...

    def list_daemons(self) -> list[DaemonSummary]:
        """Every daemon that ever beat, newest heartbeat first, with its age on one clock."""
        ...

    def file_owner(self) -> int | None:
        """The OS user id that owns the job table's file (its admin), or None where no file is."""
        ...


def admit_each(submissions: Sequence[JobSubmission], usable: set[str], have: Counter, limit: int
               ) -> list[JobSubmission | QueueFull | KeyRevoked]:
    """`submit_each`'s terms, job by job: each job, or its KeyRevoked when its key is not `usable`, or its
    QueueFull when its tenant's unfinished requests (`have`, counted in place with the jobs kept before
    it in the list) would go over `limit`."""
    outcomes: list[JobSubmission | QueueFull | KeyRevoked] = []
    for s in submissions:
        if s.key_id is not None and s.key_id not in usable:
            outcomes.append(KeyRevoked(s.key_id))
            continue
        adding = len(s.requests)
        if have[s.tenant] + adding > limit:
            outcomes.append(QueueFull(s.tenant, have[s.tenant], adding, limit))
            continue
        have[s.tenant] += adding
        outcomes.append(s)
    return outcomes
