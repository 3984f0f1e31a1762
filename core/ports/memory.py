"""MemoryQueueStore: the QueueStore contract in memory, to run the real daemon in unit tests.

Leases with epochs, fencing of stale writes, and expiry by an injected
clock (one clock for leases and heartbeats, as the database's is for the
SQL store). Single-threaded: each call is atomic because nothing else runs
during it.

Beyond the protocol, a test puts work in with `submit`, cancels jobs and
reweights tenants with `cancel_job` and `set_weight`, and reads what was
written with `request` and `requests`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from fsched.core.ports.records import (
    ClaimedRequest,
    Completion,
    DaemonSummary,
    JobSubmission,
    PeerUsage,
    StoreError,
    SubmittedJob,
    TokenUpdate,
)
from fsched.core.types import RequestClass, RequestId, RequestState, TokenLogprobs

USAGE_KEPT_S = 86_400.0


@dataclass(slots=True)
class MemoryRequest:
    """One request as the queue holds it."""

    id: RequestId
    job_id: int
    idx: int
    custom_id: str
    endpoint: str
    prompt: str | None
    messages: list | None
    params: dict
    enqueued_at: float
    state: RequestState = RequestState.QUEUED
    output_tokens: list[int] = field(default_factory=list)
    output_text: str = ""
    output_logprobs: tuple[TokenLogprobs, ...] = ()
    first_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    model: str | None = None
    error: str | None = None
    attempts: int = 0
    lease_owner: str | None = None
    lease_epoch: int = 0
    lease_expires_at: float | None = None


@dataclass(slots=True)
class MemoryJob:
    id: int
    tenant: str
    request_class: RequestClass
    priority: int
    request_ids: list[RequestId]
    cancelled: bool = False


class MemoryQueueStore:
    """A QueueStore in dictionaries; `refused` counts the writes it fenced off."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.jobs: dict[int, MemoryJob] = {}
        self._requests: dict[RequestId, MemoryRequest] = {}
        self.weights: dict[str, float] = {}
        self.daemons: dict[str, DaemonSummary] = {}
        self._usage: dict[str, tuple[float, Mapping[str, tuple[float, float]]]] = {}
        self.refused = 0

    # -- what a test does to the queue (the catalog's part, reduced) ---------------------

    def submit(self, submissions: Sequence[JobSubmission]) -> list[SubmittedJob]:
        """Queue jobs; a request without a seed gets one fixed by its place, so runs replay."""
        submitted = []
        for s in submissions:
            job_id = len(self.jobs) + 1
            created = s.tenant not in self.weights
            self.weights.setdefault(s.tenant, 1.0)
            ids = []
            for idx, spec in enumerate(s.requests):
                params = spec.params if spec.params.seed is not None else replace(
                    spec.params, seed=job_id * 1_000_003 + idx)
                request = MemoryRequest(
                    id=str(len(self._requests) + 1), job_id=job_id, idx=idx, custom_id=spec.custom_id,
                    endpoint=spec.endpoint.value, prompt=spec.prompt,
                    messages=[m.to_json() for m in spec.messages]
                    if spec.messages else None,
                    params=params.to_json(), enqueued_at=self.clock(),
                )
                self._requests[request.id] = request
                ids.append(request.id)
            self.jobs[job_id] = MemoryJob(job_id, s.tenant, s.request_class, s.priority, ids)
            submitted.append(SubmittedJob(job_id, len(ids), s.tenant, s.request_class, created))
        return submitted

    def cancel_job(self, job_id: int) -> None:
        """Cancel a job's waiting requests now; its running ones are for their daemon to stop."""
        job = self.jobs[job_id]
        job.cancelled = True
        for rid in job.request_ids:
            request = self._requests[rid]
            if request.state.waiting:
                self._end(request, RequestState.CANCELLED)

    def set_weight(self, tenant: str, weight: float) -> None:
        self.weights[tenant] = weight

    def request(self, request_id: RequestId) -> MemoryRequest:
        return self._requests[request_id]

    def requests(self) -> list[MemoryRequest]:
        return list(self._requests.values())

    # -- QueueStore ------------------------------------------------------------------------

    def claim(
        self,
        owner: str,
        per_group: int,
        held: Mapping[tuple[str, RequestClass], int] | None = None,
        limit: int | None = None,
        lease_s: float = 30.0,
    ) -> list[ClaimedRequest]:
        held = held or {}
        claimed: list[ClaimedRequest] = []
        room: dict[tuple[str, RequestClass], int] = {}
        for job in sorted(self.jobs.values(), key=lambda j: (j.priority, j.id)):
            if job.cancelled:
                continue
            group = (job.tenant, job.request_class)
            room.setdefault(group, per_group - held.get(group, 0))
            want = room[group] if limit is None else min(room[group], limit - len(claimed))
            queued = [r for r in map(self._requests.get, job.request_ids) if r.state is RequestState.QUEUED]
            for request in queued[: max(0, want)]:
                claimed.append(self._lease(request, job, owner, lease_s))
                room[group] -= 1
        return claimed

    def flush_tokens(self, owner: str, updates: Sequence[TokenUpdate]) -> int:
        written = 0
        for u in updates:
            request = self._requests.get(u.request_id)
            if request is None or not self._holds(request, owner, u.lease_epoch):
                self.refused += 1
                continue
            request.output_tokens = list(u.tokens)
            request.output_text = u.text
            request.output_logprobs = u.logprobs
            request.first_token_at = request.first_token_at or u.first_token_at
            written += 1
        return written

    def finish_requests(self, completions: Sequence[Completion], owner: str | None = None) -> list[bool]:
        for c in completions:
            if not c.state.finished:
                raise ValueError(f"{c.state} is not a final state")
            if c.request_id not in self._requests:
                raise StoreError(f"no request with id {c.request_id}")
        return [self._complete(c, owner) for c in completions]

    def release(self, owner: str | None = None, request_ids: Sequence[RequestId] | None = None) -> int:
        wanted = None if request_ids is None else set(request_ids)
        running = [
            r for r in self._requests.values()
            if r.state is RequestState.RUNNING and (owner is None or r.lease_owner == owner)
            and (wanted is None or r.id in wanted)
        ]
        for request in running:
            self._requeue(request)
        return len(running)

    def renew_leases(self, owner: str, leases: Mapping[RequestId, int], lease_s: float) -> set[RequestId]:
        kept = set()
        for rid, lease_epoch in leases.items():
            request = self._requests.get(rid)
            if request is None or not self._holds(request, owner, None):
                continue
            request.lease_expires_at = self.clock() + lease_s
            if request.lease_epoch == lease_epoch:
                kept.add(rid)
        return kept

    def reclaim_expired(self) -> int:
        now = self.clock()
        expired = [r for r in self._requests.values()
                   if r.state is RequestState.RUNNING and r.lease_expires_at < now]
        for request in expired:
            self._requeue(request)
        return len(expired)

    def exchange_usage(self, owner: str, usage: Mapping[str, tuple[float, float]]) -> list[PeerUsage]:
        now = self.clock()
        self._usage = {d: (at, u) for d, (at, u) in self._usage.items() if at >= now - USAGE_KEPT_S}
        self._usage.pop(owner, None)
        if usage:
            self._usage[owner] = (now, dict(usage))
        return [
            PeerUsage(daemon, tenant, gpu, kv, max(0.0, now - at))
            for daemon, (at, figures) in self._usage.items() if daemon != owner
            for tenant, (gpu, kv) in figures.items()
        ]

    def cancelled_held(self, owner: str) -> list[RequestId]:
        return [r.id for r in self._requests.values()
                if self._holds(r, owner, None) and self.jobs[r.job_id].cancelled]

    def tenant_weights(self) -> dict[str, float]:
        return dict(self.weights)

    def may_have_changed(self) -> bool:
        return True

    def has_queued(self, running_too: bool = False) -> bool:
        states = {RequestState.QUEUED} | ({RequestState.RUNNING} if running_too else set())
        return any(r.state in states for r in self._requests.values())

    def heartbeat(self, daemon: DaemonSummary) -> None:
        now = self.clock()
        stopped = now if daemon.stopped_at is not None else None
        self.daemons[daemon.id] = replace(daemon, heartbeat_at=now, stopped_at=stopped)

    # -- helpers -----------------------------------------------------------------------------

    def _lease(self, request: MemoryRequest, job: MemoryJob, owner: str, lease_s: float) -> ClaimedRequest:
        request.state = RequestState.RUNNING
        request.lease_owner = owner
        request.lease_epoch += 1
        request.lease_expires_at = self.clock() + lease_s
        request.attempts += 1
        return ClaimedRequest(
            id=request.id, job_id=job.id, tenant=job.tenant, request_class=job.request_class,
            priority=job.priority, custom_id=request.custom_id, endpoint=request.endpoint,
            prompt=request.prompt, messages=request.messages, params=dict(request.params),
            output_tokens=list(request.output_tokens), enqueued_at=request.enqueued_at,
            attempts=request.attempts, lease_epoch=request.lease_epoch,
            output_logprobs=request.output_logprobs,
        )

    @staticmethod
    def _holds(request: MemoryRequest, owner: str, lease_epoch: int | None) -> bool:
        """Whether `owner` holds the running request (under `lease_epoch`, when one is named)."""
        return (request.state is RequestState.RUNNING and request.lease_owner == owner
                and (lease_epoch is None or request.lease_epoch == lease_epoch))

    def _complete(self, c: Completion, owner: str | None) -> bool:
        request = self._requests[c.request_id]
        stale = c.lease_epoch is not None and request.lease_epoch != c.lease_epoch
        fenced = owner is not None and (request.lease_owner != owner or stale)
        if request.state.finished or fenced:
            self.refused += 1
            return False
        request.output_tokens = list(c.output_tokens)
        request.output_text = c.output_text
        request.output_logprobs = c.logprobs
        request.finish_reason, request.prompt_tokens = c.finish_reason, c.prompt_tokens
        request.model, request.error = c.model, c.error
        request.first_token_at = request.first_token_at or c.first_token_at
        self._end(request, c.state)
        return True

    def _requeue(self, request: MemoryRequest) -> None:
        """Back to the queue with its tokens; a cancelled job's request ends `cancelled` instead."""
        request.lease_owner = request.lease_expires_at = None
        if self.jobs[request.job_id].cancelled:
            self._end(request, RequestState.CANCELLED)
        else:
            request.state = RequestState.QUEUED

    def _end(self, request: MemoryRequest, state: RequestState) -> None:
        request.state = state
        request.finished_at = self.clock()
        request.lease_owner = request.lease_expires_at = None
