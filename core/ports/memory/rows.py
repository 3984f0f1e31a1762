"""The job table's rows in memory: what every in-memory store reads and writes, under one lock.

One `MemoryRows` plays the database: the catalog submits into it, the queue
claims from it, the serving reads see what the queue wrote back. Times are
stamped by its one injected clock (as the SQL stores stamp the database's).
A store call holds `lock` for its length, so each call is one atomic
transaction even when the HTTP server calls the stores from worker threads.

A job's counters move with its requests in the same call, and its state is
derived from them by the core's one rule (`derive_job_state`), as the SQL
stores do.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fsched.core.jobs.apikeys import ApiKey
from fsched.core.jobs.batches import BatchRecord, StoredFile
from fsched.core.jobs.jobstate import JobCounts, JobSummary, derive_job_state
from fsched.core.ports.records import DaemonSummary, UnknownJob
from fsched.core.types import (
    JobOrigin,
    JobState,
    RequestClass,
    RequestId,
    RequestStatus,
    TokenLogprobs,
)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(slots=True)
class MemoryRequest:
    """One request row."""

    id: RequestId
    job_id: int
    idx: int
    custom_id: str
    endpoint: str
    prompt: str | None
    messages: list | None
    params: dict
    enqueued_at: float
    choice: int = 0
    render: dict | None = None  # ChatRender.to_json()
    answer: dict | None = None  # the answer options that differ from the defaults (None: none do)
    model: str | None = None  # asked for at submit; the engine's, once finished
    status: RequestStatus = RequestStatus.WAITING
    output_tokens: list[int] = field(default_factory=list)
    output_text: str = ""
    output_logprobs: tuple[TokenLogprobs, ...] = ()
    first_token_at: float | None = None
    finished_at: float | None = None
    prompt_tokens: int | None = None
    error: str | None = None
    attempts: int = 0
    lease_owner: str | None = None
    lease_epoch: int = 0
    lease_expires_at: float | None = None


@dataclass(slots=True)
class MemoryJob:
    """One job row: its file, how it runs, its counters and times."""

    id: int
    tenant: str
    request_class: RequestClass
    priority: int
    name: str
    origin: JobOrigin
    key_id: str | None
    request_ids: list[RequestId]
    submitted_at: float
    state: JobState = JobState.QUEUED
    num_done: int = 0
    num_failed: int = 0
    num_cancelled: int = 0
    num_running: int = 0
    num_output_tokens: int = 0
    num_prompt_tokens: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    cancel_requested_at: float | None = None
    # Request rows deleted by a reclaim (the job keeps counting them, as the SQL job row does).
    num_reclaimed: int = 0

    @property
    def num_requests(self) -> int:
        return len(self.request_ids) + self.num_reclaimed

    @property
    def cancelled(self) -> bool:
        """A user cancelled it: no request of it is claimed again."""
        return self.cancel_requested_at is not None

    @property
    def counts(self) -> JobCounts:
        return JobCounts(self.num_requests, self.num_done, self.num_failed, self.num_cancelled,
                         self.num_running)

    @property
    def unfinished(self) -> int:
        """Requests not ended yet (waiting or running), from the counters."""
        return self.num_requests - self.counts.num_finished

    def ended(self, previous: RequestStatus, status: RequestStatus) -> None:
        """Count one request that ended in `status`, having been `previous`."""
        self.num_running -= previous is RequestStatus.RUNNING
        self.num_done += status.succeeded
        self.num_failed += status is RequestStatus.FINISHED_FAILED
        self.num_cancelled += status is RequestStatus.FINISHED_CANCELLED

    def settle(self, now: float) -> JobState:
        """The state the counters derive (and the finish time, once); as storage/counters.py writes it."""
        self.state = derive_job_state(self.counts, started=self.started_at is not None,
                                      cancel_requested=self.cancelled)
        if self.state.finished and self.finished_at is None:
            self.finished_at = now
        return self.state

    def summary(self) -> JobSummary:
        return JobSummary(
            id=self.id, tenant=self.tenant, request_class=self.request_class, priority=self.priority,
            name=self.name, state=self.state, counts=self.counts, num_output_tokens=self.num_output_tokens,
            submitted_at=self.submitted_at, started_at=self.started_at, finished_at=self.finished_at,
            origin=self.origin, key_id=self.key_id,
        )


@dataclass(slots=True)
class MemoryFile:
    """A file row: the record, whether it was deleted, and an upload's pieces."""

    record: StoredFile
    pieces: tuple[bytes, ...] = ()
    deleted_at: float | None = None


@dataclass(slots=True)
class MemoryBatch:
    record: BatchRecord
    seq: int  # creation order, by which batches page


class MemoryRows:
    """Every table's rows, the clock that stamps them and the lock each store call holds."""

    def __init__(self, clock: Callable[[], float] = time.time, file_owner: int | None = None):
        self.clock = clock
        self.file_owner = file_owner  # the OS user a file-backed table would belong to; None: no file
        self.lock = threading.RLock()
        self.tenants: dict[str, float] = {}  # name -> weight
        self.jobs: dict[int, MemoryJob] = {}
        self.requests: dict[RequestId, MemoryRequest] = {}
        self.daemons: dict[str, DaemonSummary] = {}
        self.usage: dict[str, tuple[float, Mapping[str, tuple[float, float]]]] = {}  # daemon -> (at, figures)
        self.api_keys: dict[str, ApiKey] = {}
        self.limits: dict[str, int] = {}  # the limits an admin stored, by name
        self.key_limits: dict[str, dict[str, int]] = {}  # key id -> rate limit name -> value
        self.key_rates: dict[tuple[str, str], float] = {}  # (key id, kind) -> GCRA's TAT
        self.files: dict[str, MemoryFile] = {}
        self.batches: dict[str, MemoryBatch] = {}
        self.refused = 0  # queue writes fenced off: leases their writer had lost
        self._next_job = 0
        self._next_request = 0
        self._next_batch = 0

    def job(self, job_id: int) -> MemoryJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job

    def next_job_id(self) -> int:
        self._next_job += 1
        return self._next_job

    def next_request_id(self) -> RequestId:
        self._next_request += 1
        return str(self._next_request)

    def next_batch_seq(self) -> int:
        self._next_batch += 1
        return self._next_batch

    def unfinished_of(self, tenant: str) -> int:
        """A tenant's requests not ended yet, read from its jobs' counters."""
        return sum(j.unfinished for j in self.jobs.values() if j.tenant == tenant and not j.state.finished)

    def end(self, request: MemoryRequest, status: RequestStatus, now: float) -> None:
        """A request ends: its status, its time, its lease let go, its job's counters."""
        job = self.jobs[request.job_id]
        job.ended(request.status, status)
        request.status = status
        request.finished_at = now
        request.lease_owner = request.lease_expires_at = None

    def requeue(self, requests: list[MemoryRequest], now: float) -> None:
        """Running requests back to the queue with their tokens; a cancelled job's end `cancelled`
        instead (nobody would claim them), as storage/counters.py's `requeue` does."""
        touched = set()
        for request in requests:
            job = self.jobs[request.job_id]
            request.lease_owner = request.lease_expires_at = None
            if job.cancelled:
                self.end(request, RequestStatus.FINISHED_CANCELLED, now)
            else:
                job.num_running -= 1
                request.status = RequestStatus.WAITING
            touched.add(job.id)
        for job_id in touched:
            self.jobs[job_id].settle(now)


def atomic(method: F) -> F:
    """Run a store's method holding its rows' lock: one call, one transaction."""

    @functools.wraps(method)
    def locked(self, *args, **kwargs):
        with self.rows.lock:
            return method(self, *args, **kwargs)

    return locked  # type: ignore[return-value]
