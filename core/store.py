"""What the core needs from a job table, and the errors any store raises.

`storage` implements JobStore over SQL; tests may implement it in memory.
The core never imports `storage` (DESIGN §1).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fsched.core.jobs.jobfile import ParsedJobFile
from fsched.core.jobs.jobstate import JobCounts
from fsched.core.types import JobState, RequestClass, RequestState


class StoreError(Exception):
    """Base of every error a job store raises; its message is fit for a user."""


class StorageError(StoreError):
    """The database cannot be used: locked past the timeout, read-only, full, gone."""


class UnknownJob(StoreError):
    def __init__(self, job_id: int):
        super().__init__(f"no job with id {job_id}")
        self.job_id = job_id


class UnknownTenant(StoreError):
    def __init__(self, name: str):
        super().__init__(f"no tenant named {name!r}")
        self.name = name


class TenantExists(StoreError):
    def __init__(self, name: str):
        super().__init__(f"tenant {name!r} already exists")


class TenantBusy(StoreError):
    """A tenant with unfinished jobs cannot be removed."""


class QueueFull(StoreError):
    """A submit would take a tenant's unfinished requests over the limit; nothing was stored."""

    def __init__(self, tenant: str, unfinished: int, adding: int, limit: int):
        super().__init__(
            f"tenant {tenant!r} has {unfinished:,} unfinished request(s); {adding:,} more would go "
            f"over the limit of {limit:,} a tenant (FSCHED_MAX_QUEUED_PER_TENANT); nothing was submitted"
        )
        self.tenant = tenant


class SchemaMismatch(StoreError):
    """The database was written by another version of fsched."""


@dataclass(slots=True, frozen=True)
class JobSubmission:
    """One parsed file and how to run it."""

    parsed: ParsedJobFile
    tenant: str
    request_class: RequestClass
    priority: int
    name: str

    def __post_init__(self) -> None:
        if not 0 <= self.priority <= 9:
            raise ValueError("priority must be within 0..9")


@dataclass(slots=True, frozen=True)
class SubmittedJob:
    job_id: int
    num_requests: int
    tenant: str
    request_class: RequestClass
    tenant_created: bool


@dataclass(slots=True, frozen=True)
class JobSummary:
    id: int
    tenant: str
    request_class: RequestClass
    priority: int
    name: str
    state: JobState
    counts: JobCounts
    num_output_tokens: int
    submitted_at: float
    started_at: float | None
    finished_at: float | None


@dataclass(slots=True, frozen=True)
class TenantSummary:
    name: str
    weight: float
    active_jobs: int
    queued: int
    running: int


@dataclass(slots=True, frozen=True)
class DaemonSummary:
    id: str
    host: str
    pid: int
    device: str
    model: str
    started_at: float
    heartbeat_at: float
    stopped_at: float | None
    stats: dict
    # Seconds since the heartbeat on the database's clock (set when read
    # back): the daemons' own clocks may disagree, the database's is one.
    heartbeat_age_s: float | None = None


@dataclass(slots=True, frozen=True)
class CancelOutcome:
    job_id: int
    state: JobState
    cancelled_now: int  # waiting requests cancelled at once
    stopping: int  # running requests the daemon stops at its next step
    already_finished: bool


@dataclass(slots=True, frozen=True)
class RequestResult:
    id: int
    idx: int
    custom_id: str
    endpoint: str
    state: RequestState
    model: str | None
    output_text: str
    num_output_tokens: int
    prompt_tokens: int | None
    finish_reason: str | None
    error: str | None
    finished_at: float | None


@dataclass(slots=True, frozen=True)
class ClaimedRequest:
    id: int
    job_id: int
    tenant: str
    request_class: RequestClass
    priority: int
    custom_id: str
    endpoint: str
    prompt: str | None
    messages: list | None
    params: dict
    output_tokens: list[int]
    enqueued_at: float
    attempts: int = 1  # claims so far, this one included
    # The fencing token: every write-back names it, and is refused once
    # another claim (after this lease expired) has raised it.
    lease_epoch: int = 0


@dataclass(slots=True, frozen=True)
class RequestProgress:
    """One request as a reader of its output sees it: what `fsched generate` polls."""

    id: int
    job_id: int
    state: RequestState
    output_text: str
    num_output_tokens: int
    enqueued_at: float
    first_token_at: float | None
    finished_at: float | None
    finish_reason: str | None
    error: str | None


@dataclass(slots=True, frozen=True)
class RequestTiming:
    """A request's timestamps and size, for latency summaries (first token - enqueued)."""

    id: int
    job_id: int
    tenant: str
    request_class: RequestClass
    state: RequestState
    num_output_tokens: int
    enqueued_at: float
    first_token_at: float | None
    finished_at: float | None


@dataclass(slots=True, frozen=True)
class Completion:
    """A request's end: final state and output, written in one transaction."""

    request_id: int
    state: RequestState
    output_tokens: tuple[int, ...] = ()
    output_text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    model: str | None = None
    error: str | None = None
    first_token_at: float | None = None
    epoch: int | None = None  # the writer's lease epoch (None: not fenced by epoch)


@dataclass(slots=True, frozen=True)
class TokenUpdate:
    """A running request's output so far, to persist."""

    request_id: int
    tokens: tuple[int, ...]
    text: str
    first_token_at: float | None = None
    epoch: int | None = None  # the writer's lease epoch (None: not fenced by epoch)


@dataclass(slots=True, frozen=True)
class PeerUsage:
    """Another daemon's decayed usage of one tenant, as it last published it."""

    daemon: str
    tenant: str
    gpu_s: float
    kv_token_s: float
    age_s: float  # since it was published, on the database's clock


@runtime_checkable
class JobStore(Protocol):
    def submit(
        self, submissions: Sequence[JobSubmission], max_queued_per_tenant: int = ...
    ) -> list[SubmittedJob]: ...

    def list_jobs(
        self, job_id: int | None = None, tenant: str | None = None, include_finished: bool = True
    ) -> list[JobSummary]: ...

    def cancel_job(self, job_id: int) -> CancelOutcome: ...

    def iter_results(self, job_id: int, errors: bool = False) -> Iterator[RequestResult]: ...

    def request_progress(self, job_id: int) -> list[RequestProgress]: ...

    def request_timings(self, job_ids: Sequence[int]) -> list[RequestTiming]: ...

    def list_tenants(self) -> list[TenantSummary]: ...

    def add_tenant(self, name: str, weight: float = 1.0) -> None: ...

    def set_weight(self, name: str, weight: float) -> None: ...

    def remove_tenant(self, name: str) -> None: ...

    def list_daemons(self) -> list[DaemonSummary]: ...

    def claim(
        self,
        owner: str,
        per_group: int,
        held: Mapping[tuple[str, RequestClass], int] | None = None,
        limit: int | None = None,
        lease_s: float = 30.0,
    ) -> list[ClaimedRequest]: ...

    def flush_tokens(self, owner: str, updates: Sequence[TokenUpdate]) -> int: ...

    def finish_requests(self, completions: Sequence[Completion], owner: str | None = None) -> list[bool]: ...

    def release(self, owner: str | None = None, request_ids: Sequence[int] | None = None) -> int: ...

    def renew_leases(self, owner: str, leases: Mapping[int, int], lease_s: float) -> set[int]: ...

    def reclaim_expired(self) -> int: ...

    def exchange_usage(
        self, owner: str, usage: Mapping[str, tuple[float, float]]
    ) -> list[PeerUsage]: ...

    def cancelled_held(self, owner: str) -> list[int]: ...

    def tenant_weights(self) -> dict[str, float]: ...

    def has_queued(self, running_too: bool = False) -> bool: ...

    def heartbeat(self, daemon: DaemonSummary) -> None: ...

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
    ) -> bool: ...
