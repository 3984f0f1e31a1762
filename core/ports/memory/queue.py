"""MemoryQueueStore: the QueueStore contract in memory, to run the real daemon in unit tests.

Leases with epochs, fencing of stale writes, and expiry by the rows' clock
(one clock for leases and heartbeats, as the database's is for the SQL
store); the jobs' counters and states move as storage/claim.py and
storage/counters.py move them.

Made alone (`MemoryQueueStore(clock)`), it has rows of its own; a test puts
work in with `submit`, cancels jobs and reweights tenants with `cancel_job`
and `set_weight` (the catalog's, over the same rows), and reads what was
written with `request` and `requests`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from fsched.core.jobs.limits import DEFAULT_MAX_QUEUED_PER_TENANT
from fsched.core.ports.memory.catalog import MemoryCatalogStore
from fsched.core.ports.memory.rows import MemoryJob, MemoryRequest, MemoryRows, atomic
from fsched.core.ports.queue import ClaimAsk, StepWritten
from fsched.core.ports.records import (
    CancelOutcome,
    Completion,
    DaemonSummary,
    JobSubmission,
    PeerUsage,
    StoreError,
    SubmittedJob,
    TokenUpdate,
)
from fsched.core.sched.request import Request
from fsched.core.types import RequestClass, RequestId, RequestStatus, SamplingParams

USAGE_KEPT_S = 86_400.0


class MemoryQueueStore:
    """A QueueStore over `rows` (new ones on `clock` when none are given); `refused` counts the writes it
    fenced off."""

    def __init__(self, clock: Callable[[], float] = time.time, rows: MemoryRows | None = None):
        self.rows = rows if rows is not None else MemoryRows(clock)
        self.clock = self.rows.clock

    # -- what a test does to the queue (the catalog's part) ---------------------------------

    def submit(self, submissions: Sequence[JobSubmission]) -> list[SubmittedJob]:
        return MemoryCatalogStore(self.rows).submit(submissions, DEFAULT_MAX_QUEUED_PER_TENANT)

    def cancel_job(self, job_id: int) -> CancelOutcome:
        return MemoryCatalogStore(self.rows).cancel_job(job_id)

    def set_weight(self, tenant: str, weight: float) -> None:
        MemoryCatalogStore(self.rows).set_weight(tenant, weight)

    def request(self, request_id: RequestId) -> MemoryRequest:
        return self.rows.requests[request_id]

    def requests(self) -> list[MemoryRequest]:
        return list(self.rows.requests.values())

    @property
    def daemons(self) -> dict[str, DaemonSummary]:
        return self.rows.daemons

    @property
    def refused(self) -> int:
        return self.rows.refused

    # -- QueueStore ------------------------------------------------------------------------

    @atomic
    def claim(
        self,
        owner: str,
        per_group: int,
        held: Mapping[tuple[str, RequestClass], int] | None = None,
        limit: int | None = None,
        lease_s: float = 30.0,
        announced: bool = False,
    ) -> list[Request]:
        held = held or {}
        claimed: list[Request] = []
        room: dict[tuple[str, RequestClass], int] = {}
        now = self.clock()
        for job in sorted(self.rows.jobs.values(), key=lambda j: (j.priority, j.id)):
            if job.cancelled or job.state.finished:
                continue
            group = (job.tenant, job.request_class)
            room.setdefault(group, per_group - held.get(group, 0))
            want = room[group] if limit is None else min(room[group], limit - len(claimed))
            taken = [r for r in map(self.rows.requests.get, job.request_ids)
                     if r.status is RequestStatus.WAITING][: max(0, want)]
            for request in taken:
                claimed.append(self._lease(request, job, owner, now + lease_s))
            if taken:
                job.num_running += len(taken)
                job.started_at = job.started_at or now
                job.settle(now)
                room[group] -= len(taken)
        return claimed

    @atomic
    def flush_tokens(self, owner: str, updates: Sequence[TokenUpdate]) -> int:
        written = 0
        for u in updates:
            request = self.rows.requests.get(u.request_id)
            if request is None or not self._holds(request, owner, u.lease_epoch):
                self.rows.refused += 1
                continue
            self.rows.jobs[request.job_id].num_output_tokens += len(u.tokens) - len(request.output_tokens)
            request.output_tokens = list(u.tokens)
            request.output_text = u.text
            request.output_logprobs = u.logprobs
            if request.first_token_at is None:
                request.first_token_at = u.first_token_at
            written += 1
        return written

    @atomic
    def finish_requests(self, completions: Sequence[Completion], owner: str | None = None) -> list[bool]:
        for c in completions:
            if not c.status.is_finished:
                raise ValueError(f"{c.status.word} is not a final status")
            if c.request_id not in self.rows.requests:
                raise StoreError(f"no request with id {c.request_id}")
        now = self.clock()
        outcome = [self._complete(c, owner, now) for c in completions]
        for job_id in {self.rows.requests[c.request_id].job_id for c in completions}:
            self.rows.jobs[job_id].settle(now)
        return outcome

    @atomic
    def write_step(self, owner: str, updates: Sequence[TokenUpdate], completions: Sequence[Completion],
                   claim: ClaimAsk | None = None) -> StepWritten:
        """The three under one hold of the rows' lock; what could refuse the completions is checked
        before anything is written, so the call changes all it says or (it raises) nothing."""
        for c in completions:
            if not c.status.is_finished:
                raise ValueError(f"{c.status.word} is not a final status")
            if c.request_id not in self.rows.requests:
                raise StoreError(f"no request with id {c.request_id}")
        written = self.flush_tokens(owner, updates) if updates else 0
        finished = self.finish_requests(completions, owner) if completions else []
        claimed = [] if claim is None else self.claim(owner, claim.per_group, claim.held, claim.limit,
                                                      claim.lease_s, announced=True)
        return StepWritten(written, finished, claimed)

    @atomic
    def release(self, owner: str | None = None, request_ids: Sequence[RequestId] | None = None) -> int:
        wanted = None if request_ids is None else set(request_ids)
        running = [
            r for r in self.rows.requests.values()
            if r.status is RequestStatus.RUNNING and (owner is None or r.lease_owner == owner)
            and (wanted is None or r.id in wanted)
        ]
        self.rows.requeue(running, self.clock())
        return len(running)

    @atomic
    def renew_leases(self, owner: str, leases: Mapping[RequestId, int], lease_s: float) -> set[RequestId]:
        kept = set()
        for rid, lease_epoch in leases.items():
            request = self.rows.requests.get(rid)
            if request is None or not self._holds(request, owner, None):
                continue
            request.lease_expires_at = self.clock() + lease_s
            if request.lease_epoch == lease_epoch:
                kept.add(rid)
        return kept

    @atomic
    def reclaim_expired(self) -> int:
        now = self.clock()
        expired = [r for r in self.rows.requests.values()
                   if r.status is RequestStatus.RUNNING and r.lease_expires_at < now]
        self.rows.requeue(expired, now)
        return len(expired)

    @atomic
    def exchange_usage(self, owner: str, usage: Mapping[str, tuple[float, float]]) -> list[PeerUsage]:
        now = self.clock()
        kept = {d: (at, u) for d, (at, u) in self.rows.usage.items() if at >= now - USAGE_KEPT_S}
        kept.pop(owner, None)
        if usage:
            kept[owner] = (now, dict(usage))
        self.rows.usage = kept
        return [
            PeerUsage(daemon, tenant, gpu, kv, max(0.0, now - at))
            for daemon, (at, figures) in kept.items() if daemon != owner
            for tenant, (gpu, kv) in figures.items()
        ]

    @atomic
    def cancelled_held(self, owner: str) -> list[RequestId]:
        return [r.id for r in self.rows.requests.values()
                if self._holds(r, owner, None) and self.rows.jobs[r.job_id].cancelled]

    @atomic
    def tenant_weights(self) -> dict[str, float]:
        return dict(self.rows.tenants)

    def may_have_changed(self) -> bool:
        return True

    def prepare(self, largest: int) -> None:
        """Nothing to compile in memory."""

    def keep_statistics(self) -> None:
        """No planner in memory."""

    @atomic
    def has_queued(self, running_too: bool = False) -> bool:
        states = {RequestStatus.WAITING} | ({RequestStatus.RUNNING} if running_too else set())
        return any(r.status in states for r in self.rows.requests.values())

    @atomic
    def heartbeat(self, daemon: DaemonSummary) -> None:
        now = self.clock()
        stopped = now if daemon.stopped_at is not None else None
        self.rows.daemons[daemon.id] = replace(daemon, heartbeat_at=now, stopped_at=stopped,
                                               heartbeat_age_s=None)

    # -- helpers -----------------------------------------------------------------------------

    @staticmethod
    def _lease(request: MemoryRequest, job: MemoryJob, owner: str, expires_at: float) -> Request:
        request.status = RequestStatus.RUNNING
        request.lease_owner = owner
        request.lease_epoch += 1
        request.lease_expires_at = expires_at
        request.attempts += 1
        return Request.to_run(
            request.id, (), SamplingParams.from_json(request.params), job.tenant, job.request_class,
            job.priority, list(request.output_tokens), request.output_logprobs, prompt_text=request.prompt,
            messages=request.messages, render=request.render, job_id=job.id, custom_id=request.custom_id,
            enqueued_at=request.enqueued_at, lease_epoch=request.lease_epoch, attempts=request.attempts,
        )

    @staticmethod
    def _holds(request: MemoryRequest, owner: str, lease_epoch: int | None) -> bool:
        """Whether `owner` holds the running request (under `lease_epoch`, when one is named)."""
        return (request.status is RequestStatus.RUNNING and request.lease_owner == owner
                and (lease_epoch is None or request.lease_epoch == lease_epoch))

    def _complete(self, c: Completion, owner: str | None, now: float) -> bool:
        request = self.rows.requests[c.request_id]
        stale = c.lease_epoch is not None and request.lease_epoch != c.lease_epoch
        fenced = owner is not None and (request.lease_owner != owner or stale)
        if request.status.is_finished or fenced:
            self.rows.refused += 1
            return False
        job = self.rows.jobs[request.job_id]
        job.num_output_tokens += len(c.output_tokens) - len(request.output_tokens)
        job.num_prompt_tokens += c.prompt_tokens or 0
        request.output_tokens = list(c.output_tokens)
        request.output_text = c.output_text
        request.output_logprobs = c.logprobs
        request.prompt_tokens = c.prompt_tokens
        request.model, request.error = c.model, c.error
        if request.first_token_at is None:
            request.first_token_at = c.first_token_at
        self.rows.end(request, c.status, now)
        return True
